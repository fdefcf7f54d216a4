"""The HTTP toolkit every face's operations stand on: operations declared once (``routing``), the request path
that serves them (``http``), ``/openapi.json`` from the same declarations (``openapi``) and the API docs page
(``docs_page``). It knows no face; it stands on ``core`` (errors, auth, the runtime context)."""
