from django.urls import include, path

urlpatterns = [path("", include("acp_channels.urls"))]
