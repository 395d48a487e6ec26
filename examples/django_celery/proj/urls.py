"""URL routes of the report service."""

from django.urls import path
from reports import views

urlpatterns = [
    path("reports/", views.create_report),
    path("reports/<str:task_id>/", views.report_status),
    path("reports/<str:task_id>/delivered/", views.report_delivered),
]
