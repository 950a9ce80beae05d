"""The bottom layer: values and their vocabulary, limits, the error hierarchy, the text
reader, canonical text, safe display of peers' text, files and the on-disk cache. Imports
nothing of CBCL's but the optional native module. Private: the public names are
re-exported by :mod:`cbcl`."""
