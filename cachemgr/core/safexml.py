"""XML from outside (a libvirt domain definition, the one a migration brings on a hook's
stdin) read as data: a document type declaration, and with it every entity declaration, is
refused before anything else reads the text. libvirt never writes one; a document that has
one was not written by libvirt. Standard library only (the libvirt hook's fast path imports
this)."""

from __future__ import annotations

from xml.parsers import expat


class UnsafeXml(ValueError):
    """The text declares a document type or entities, or does not parse."""


def check(text: str) -> None:
    """Raise :class:`UnsafeXml` when ``text`` has a DOCTYPE or an entity declaration (an
    entity's expansion, internal or external, is never reached: the parse stops at the
    declaration), or is not well-formed XML."""
    p = expat.ParserCreate()

    def refuse(*_: object) -> None:
        raise UnsafeXml("a document type declaration (DOCTYPE, entities) is refused: "
                        "libvirt writes none")

    p.StartDoctypeDeclHandler = refuse
    p.EntityDeclHandler = refuse
    p.ExternalEntityRefHandler = refuse  # type: ignore[assignment]
    try:
        p.Parse(text, True)
    except expat.ExpatError as exc:
        raise UnsafeXml(f"not well-formed XML: {exc}") from None
