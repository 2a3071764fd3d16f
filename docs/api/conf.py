"""Sphinx configuration of mecsim's API reference: ``mecsim.api`` and ``mecsim.testing``.

Build (README.md beside this file)::

    python -m sphinx -W --keep-going -b html docs/api /tmp/mecsim-api
"""

from __future__ import annotations

import mecsim.api

project = "mecsim"
version = release = mecsim.api.VERSION
extensions = ["sphinx.ext.autodoc"]
# the members each module lists in __all__ (a dataclass's fields too, documented or not), in
# the order of the source; type hints in the description (the signatures stay readable)
autodoc_default_options = {"members": True, "undoc-members": True, "member-order": "bysource"}
autodoc_typehints = "description"
autodoc_class_signature = "separated"
# ``code`` in the docstrings is code, as on GitHub
default_role = "code"
exclude_patterns = ["README.md"]
html_theme = "alabaster"
html_title = f"mecsim API {mecsim.api.VERSION}"
