"""Reports: built by a Celery task, fetched over HTTP."""
