"""The report service's Django project; the Celery app loads with Django, as usual."""

from .celery import app as celery_app

__all__ = ("celery_app",)
