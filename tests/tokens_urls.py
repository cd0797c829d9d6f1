"""The demo's URLs and Django's admin (tests.tokens_site)."""

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path

urlpatterns: list[URLPattern | URLResolver] = [
    path("admin/", admin.site.urls),
    path("", include("demo_project.urls")),
]
