from django.apps import AppConfig


class SoakJobsConfig(AppConfig):
    name = "testproject.soakjobs"
    label = "soakjobs"
    verbose_name = "Soak test jobs"
    default_auto_field = "django.db.models.BigAutoField"
