"""The executor daemon: reads the task streams, validates, claims, routes and finishes tasks."""
