"""MkDocs hooks for the kolo docs site (mkdocs.yml lists this file under ``hooks``).

kolo's docstrings are written for Sphinx-style readers; mkdocstrings renders them as Markdown,
which leaves two reST spellings on the page. This rewrites them as Sphinx would show them:

- a role before a cross-reference (``:class:`ProcessSet```, ``:func:`~kolo.torch.init```):
  mkdocstrings renders the name as code with the role in front; the role goes, and a ``~``
  drops the module path, so the page reads ``ProcessSet`` and ``init``;
- a paragraph that introduces a literal block with ``::`` (``Example::``) ends in one colon.
"""

import re

_SPHINX_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj):<code>(~(?:[\w.]*\.)?)?([^<]*)</code>"
)
_LITERAL_BLOCK_MARKER = re.compile(r"::</p>(\s*<pre>)")


def on_page_content(html, page, config, files):
    """Rewrite the reST roles and ``::`` markers left in rendered docstrings."""
    html = _SPHINX_ROLE.sub(r"<code>\2</code>", html)
    return _LITERAL_BLOCK_MARKER.sub(r":</p>\1", html)
