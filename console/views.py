from django.db import connection
from django.http import JsonResponse


def healthz(request):
    """Liveness/readiness for load balancers and the container HEALTHCHECK."""
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
    return JsonResponse({"status": "ok"})
