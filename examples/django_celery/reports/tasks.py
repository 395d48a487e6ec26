"""The report task: its result is owed to the user who asked for it (``tsg_delivery``)."""

import time

from celery import shared_task


@shared_task(tsg_delivery=True)
def build_report(pages: int, seconds_per_page: float = 0.0) -> dict[str, int]:
    """Build a report of ``pages`` pages (the sleep stands for the real work)."""
    for _ in range(pages):
        time.sleep(seconds_per_page)
    return {"pages": pages}
