"""The Django app of novaque: ``"novaque.django"`` in ``INSTALLED_APPS``."""

from __future__ import annotations

from django.apps import AppConfig

from novaque.django._connect import novaque_settings


class NovaqueConfig(AppConfig):  # type: ignore[misc]  # Django is untyped
    """Registers the ``novaque`` management command; checks ``settings.NOVAQUE`` at start."""

    name = "novaque.django"
    label = "novaque"
    verbose_name = "novaque"

    def ready(self) -> None:
        novaque_settings()  # a misspelt key fails at start, not at the first publish
