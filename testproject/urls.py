from django.contrib import admin
from django.urls import path

from django_sqlqueue.ops.metrics import metrics_view

urlpatterns = [path("admin/", admin.site.urls), path("sqlqueue/metrics", metrics_view, name="sqlqueue-metrics")]
