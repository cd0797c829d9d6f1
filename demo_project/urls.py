from django.urls import include, path

from demo_project.views import index

urlpatterns = [path("", index, name="demo-page"), path("", include("acp_channels.urls"))]
