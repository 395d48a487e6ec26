"""HTTP views: ask for a report, read its state, confirm that it reached the user."""

import json

from celery.result import AsyncResult
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from proj.celery import guard
from task_state_guard import StateConflict, TaskNotFound

from .tasks import build_report


@csrf_exempt
@require_POST
def create_report(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body or b"{}")
    pages = int(body.get("pages", 1))
    seconds = float(body.get("seconds_per_page", 0.0))
    result = build_report.delay(pages, seconds)
    return JsonResponse({"task_id": result.id, "ledger_id": guard.logical_task_id(result.id)})


@require_GET
def report_status(request: HttpRequest, task_id: str) -> JsonResponse:
    result = AsyncResult(task_id)
    body: dict[str, object] = {"task_id": task_id, "state": result.state}
    if result.successful():
        body["report"] = result.result
    elif result.failed():
        body["error"] = type(result.result).__name__
    return JsonResponse(body)


@csrf_exempt
@require_POST
def report_delivered(request: HttpRequest, task_id: str) -> JsonResponse:
    """The client confirms it received the report: the ledger's delivery is closed."""
    try:
        task = guard.mark_delivered(task_id)
    except (TaskNotFound, StateConflict) as exc:  # unknown, still running, or already closed
        return JsonResponse({"error": type(exc).__name__}, status=409)
    return JsonResponse({"delivery": None if task is None else task.delivery_status.value})
