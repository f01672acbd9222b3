"""The HTTP surface: ``POST /cdc``, the /v1 REST resources, health, OpenAPI, the dashboard.

- :mod:`cdc`: ``POST /cdc`` (the Go milvus-cdc protocol) and the JSON error middleware.
- :mod:`rest`: the /v1 REST resources (tasks, fleet, disaster-recovery jobs).
- :mod:`health`: ``/livez``, ``/readyz``, ``/metrics``.
- :mod:`openapi`: the ``/openapi.json`` document.
- :mod:`auth`: tokens, roles and the audit log line of every request.
- :mod:`common`: what the handlers share (reading a JSON body, failure answers, positions).
- ``dashboard/``: the static page at ``/``.

The application state these handlers read lives in :mod:`server.app_state`; the routes are
mounted by the composition root, :func:`server.app.create_app`, from the route modules
themselves. This package re-exports only the authenticator: the application state names its
type, and importing a route module from here would run it before that state exists.
"""

from server.http.auth import ANONYMOUS, Authenticator, Principal

__all__ = ["ANONYMOUS", "Authenticator", "Principal"]
