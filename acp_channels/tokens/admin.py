"""The admin of tokens: issue one (its secret is shown once, on the page the add form answers
with, and kept nowhere), see them, revoke them. The secret is never in a message or a log."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from acp_channels.tokens.models import SCOPES, AgentToken

#: Where save_model leaves the secret for response_add, on the request of the add form only.
SECRET_ATTRIBUTE = "_acp_token_secret"


class AgentTokenForm(forms.ModelForm):  # type: ignore[type-arg]
    scopes = forms.MultipleChoiceField(
        choices=[(scope, scope) for scope in SCOPES],
        initial=[SCOPES[0]],
        widget=forms.CheckboxSelectMultiple,
        help_text="Names from the ACP remote security draft (provisional). acp:connect opens connections.",
    )

    class Meta:
        model = AgentToken
        fields = ("user", "name", "expires", "scopes", "revoked")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.initial["scopes"] = self.instance.scope_list

    def clean_scopes(self) -> str:
        return " ".join(self.cleaned_data["scopes"])


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = AgentTokenForm
    list_display = ("name", "user", "created", "expires", "last_used", "scopes", "revoked")
    list_filter = ("revoked",)
    search_fields = ("name", "user__username")
    readonly_fields = ("created", "last_used")
    actions = ("revoke",)
    raw_id_fields = ("user",)

    def get_fields(self, request: HttpRequest, obj: AgentToken | None = None) -> tuple[str, ...]:
        if obj is None:
            return ("user", "name", "expires", "scopes")
        return ("user", "name", "expires", "scopes", "revoked", "created", "last_used")

    def get_readonly_fields(self, request: HttpRequest, obj: AgentToken | None = None) -> tuple[str, ...]:
        return ("user", "created", "last_used") if obj is not None else ()

    def save_model(self, request: HttpRequest, obj: AgentToken, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
        else:
            setattr(request, SECRET_ATTRIBUTE, obj.issue())

    def response_add(self, request: HttpRequest, obj: AgentToken, post_url_continue: str | None = None) -> HttpResponse:
        secret = getattr(request, SECRET_ATTRIBUTE, None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        delattr(request, SECRET_ATTRIBUTE)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Token created",
            "token": obj,
            "secret": secret,
        }
        response = TemplateResponse(request, "acp_tokens/token_created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[AgentToken]) -> None:
        count = queryset.update(revoked=True)
        self.message_user(request, f"{count} token(s) revoked.", messages.SUCCESS)
