"""The operator's admin, registered when Django's admin autodiscovers ``django_sqlqueue.admin``.

Floors, top to bottom: :mod:`.site` (the model admins and their registration) -> the pages beside it
(:mod:`.actions`, :mod:`.triage`, :mod:`.schedules`, :mod:`.subtypes`, :mod:`.throughput`,
:mod:`.workflows`) -> :mod:`.types` -> :mod:`.views` -> :mod:`.filters`. Import a page's names from its
module; :class:`~.subtypes.SubtypeInline` and :func:`~.subtypes.register_subtype_inline` are the ones a
project uses.
"""

from . import site  # noqa: F401  (registers the model admins)
