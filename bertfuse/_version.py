"""The package version, in a module of its own: inner rooms read it here, not from the
package face (bertfuse/__init__.py), so that no import runs back up to the root."""

__version__ = "0.1.0"
