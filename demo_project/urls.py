from django.conf import settings
from django.urls import URLPattern, URLResolver, include, path

from demo_project.views import index

urlpatterns: list[URLPattern | URLResolver] = [
    path("", index, name="demo-page"),
    path("", include("acp_channels.urls")),
]
if getattr(settings, "DEMO_OAUTH", False):  # ACP_DEMO_OAUTH=1: django-oauth-toolkit's endpoints and a login page
    from demo_project.oauth import urls

    urlpatterns += urls()
