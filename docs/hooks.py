"""MkDocs hook: fills the generated reference pages at build time (``hooks:`` in mkdocs.yml).

A page holding the line ``<!-- generated: config-reference -->``,
``<!-- generated: config-fields -->`` or ``<!-- generated: cli-reference -->`` gets that line
replaced by ``gen_ref.config_reference()`` / ``gen_ref.own_fields_table()`` /
``gen_ref.cli_reference()``, computed from the code each build, so the reference can never drift from ``ECreditConfig`` or the argparse parsers.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_ref  # noqa: E402 - after the path entry above

_MARKERS = {
    "<!-- generated: config-reference -->": gen_ref.config_reference,
    "<!-- generated: cli-reference -->": gen_ref.cli_reference,
    "<!-- generated: config-fields -->": gen_ref.own_fields_table,
}


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Replace each generation marker of the page with its generated Markdown."""
    for marker, make in _MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
