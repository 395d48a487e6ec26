"""Settings of the report service (a minimal Django project with a Celery worker)."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-example-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = ["reports"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "proj.urls"
DATABASES: dict[str, dict[str, str]] = {}  # the service keeps no Django models
USE_TZ = True

# Celery, read by proj/celery.py through config_from_object(..., namespace="CELERY").
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", CELERY_BROKER_URL)
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_QUEUE", "reports")
CELERY_TASK_TRACK_STARTED = True  # the backend says STARTED while a report is built
CELERY_TASK_TIME_LIMIT = 600  # hard limit; the stop timeout of the deployment is matched to it
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# TaskStateGuard's Celery adapter: app.conf.tsg_<name>, i.e. CELERY_TSG_<NAME> here.
CELERY_TSG_DB = os.environ.get("TSG_DB", "/var/lib/tsg/tasks.sqlite")
CELERY_TSG_ACTIVE_GRACE_SECONDS = 600
CELERY_TSG_RECONCILE_ON_BOOT = True
