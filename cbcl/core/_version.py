"""The package's version, kept here so that every layer can name it without importing the
package root (which imports every layer)."""

__version__ = "0.1.0"
