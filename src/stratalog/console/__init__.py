"""The web console: a page (static/: plain HTML, CSS and JavaScript, no build step) and its JSON
API (routes.py) over ``ConsoleService`` (service.py). The broker's admin endpoint serves it
(broker/console_api.py); ``stratalog console --bootstrap`` serves it for a remote broker or
cluster (remote.py)."""
