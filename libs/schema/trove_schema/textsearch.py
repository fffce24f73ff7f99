"""Which Postgres text search configuration a page's language uses.

The recorder builds ``pages.keywords_tsv`` with it and ``trove search`` parses queries
with it: both must agree, so it lives here, once.
"""

from __future__ import annotations

#: Postgres text search configurations by BCP-47 primary language tag.
TS_CONFIGS = {
    "ar": "arabic", "ca": "catalan", "da": "danish", "de": "german", "el": "greek",
    "en": "english", "es": "spanish", "eu": "basque", "fi": "finnish", "fr": "french",
    "ga": "irish", "hi": "hindi", "hu": "hungarian", "hy": "armenian", "id": "indonesian",
    "it": "italian", "lt": "lithuanian", "ne": "nepali", "nl": "dutch", "no": "norwegian",
    "nb": "norwegian", "nn": "norwegian", "pt": "portuguese", "ro": "romanian",
    "ru": "russian", "sr": "serbian", "sv": "swedish", "ta": "tamil", "tr": "turkish",
    "yi": "yiddish",
}  # fmt: skip


def ts_config(language: str | None) -> str:
    """The configuration for text in ``language`` (a BCP-47 tag); 'simple' if none fits."""
    if not language:
        return "simple"
    return TS_CONFIGS.get(language.split("-")[0].lower(), "simple")
