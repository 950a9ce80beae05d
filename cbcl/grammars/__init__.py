"""CBCL's built-in grammars, shipped as package data (``cbcl.grammars``)."""
