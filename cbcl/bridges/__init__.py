"""Other agent systems: FIPA ACL, SPADE (XMPP), A2A and MCP. The A2A and MCP modules need
their extras and are imported by :mod:`cbcl.interop` when first named. Private: the public
names are in :mod:`cbcl.interop`."""
