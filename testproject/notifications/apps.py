from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "testproject.notifications"
    label = "notifications"
    default_auto_field = "django.db.models.BigAutoField"
