"""The console's own middleware."""

from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.http import HttpResponse
from django.shortcuts import resolve_url


class HtmxSignInMiddleware:
    """An htmx request after the session ended (expired, signed out in another
    tab) is answered by ``login_required`` with a redirect to the sign-in page;
    the browser follows it inside the request and htmx swapped the whole
    sign-in page into the card it was refreshing, under a top bar still naming
    the user. Instead the answer tells htmx to open the sign-in page as a page
    (``HX-Redirect``), coming back afterwards to the page the user was on (its
    ``HX-Current-URL``), not to the fragment or action URL that was asked for."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.headers.get("HX-Request") != "true" or response.status_code not in (301, 302, 303, 307, 308):
            return response
        login = resolve_url(settings.LOGIN_URL)
        if urlsplit(response.get("Location", "")).path != login:
            return response
        current = urlsplit(request.headers.get("HX-Current-URL", ""))
        if current.netloc == request.get_host() and current.path.startswith("/"):
            back = current.path + (f"?{current.query}" if current.query else "")
        else:
            back = request.get_full_path() if request.method == "GET" else "/"
        answer = HttpResponse(status=200)
        answer["HX-Redirect"] = f"{login}?{urlencode({'next': back})}"
        return answer
