# mysite/asgi.py
import os

from acp_channels import build_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
application = build_asgi_application()  # HTTP through Django, WebSocket on the same /acp path
