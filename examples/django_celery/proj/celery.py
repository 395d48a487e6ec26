"""The Celery app: configured from Django's settings (``CELERY_*``), recorded in the ledger."""

import os

from celery import Celery
from task_state_guard_celery import install

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# The ledger path and the adapter's other settings come from CELERY_TSG_* in settings.py.
# Every worker process records its tasks; a worker's boot reconcile closes what a killed
# worker left running and writes FAILURE for it into the result backend.
guard = install(app)
