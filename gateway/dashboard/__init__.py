"""The operator dashboard at ``/dashboard``: a static page (vanilla JS, hand-drawn SVG charts, no
build step, nothing fetched from another origin) over a JSON API computed from the decision store."""

from gateway.dashboard.auth import DashboardAuth
from gateway.dashboard.routes import ROUTES as DASHBOARD_ROUTES
from gateway.dashboard.summary import build_summary

__all__ = ["DASHBOARD_ROUTES", "DashboardAuth", "build_summary"]
