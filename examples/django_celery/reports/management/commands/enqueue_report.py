"""``manage.py enqueue_report PAGES``: queue a report from a shell or a cron job."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from reports.tasks import build_report


class Command(BaseCommand):
    help = "Queue a report build; prints the Celery task id."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("pages", type=int)
        parser.add_argument("--seconds-per-page", type=float, default=0.0)

    def handle(self, *args: Any, **options: Any) -> None:
        result = build_report.delay(options["pages"], options["seconds_per_page"])
        self.stdout.write(result.id)
