"""The REST port: waitress serving the REST app, with what TF Serving's HTTP server does
beside it and a drain it lacks.

- Waitress's own refusals (a body over --max_body_bytes, a malformed request line,
  headers too large) answer as the app does, `{"error": ...}` in JSON; a body of exactly
  --max_body_bytes is taken (waitress refuses from the limit on, so it gets one byte more).
- `stop_accepting` closes the listening socket (new connections are refused) while the
  connections already open keep being answered, each answer from then on with
  `Connection: close`; `stop` then waits until no request is running and none has come
  for a moment, flushes the last answers and closes.
"""

import threading
import time

from sat_tf.server import rest_codec
from sat_tf.server.rest_app import reason

# After the last request of a drain, how long the open connections may still bring one.
QUIET_SECONDS = 0.5
# Open connections at once; past it waitress stops accepting until one closes.
CONNECTION_LIMIT = 2000


def _channel_class(owner, max_body_bytes):
    """Waitress's connection class, its answers to errors in JSON and its keep-alive
    ended while `owner` drains."""
    from waitress import channel, task

    class ErrorTask(task.ErrorTask):
        def execute(self):
            error = self.request.error
            if error.code == 413:
                message = f"the request body is over --max_body_bytes ({max_body_bytes} bytes)"
            else:
                message = f"{error.reason}: {error.body}"
            body = rest_codec.error_body(message)
            self.status = f"{error.code} {reason(error.code)}"
            self.response_headers.append(("Content-Type", "application/json"))
            self.set_close_on_finish()
            self.content_length = len(body)
            self.write(body)

    class WSGITask(task.WSGITask):
        def execute(self):
            if owner.draining.is_set():
                self.set_close_on_finish()
            super().execute()

    class Channel(channel.HTTPChannel):
        error_task_class = ErrorTask
        task_class = WSGITask

    return Channel


class RestServer:
    """Waitress serving `app` in a thread.

    Args:
      app: the WSGI app.
      host, port: where it listens (port 0: a free one, then `port` is the bound one).
      threads: threads running the app.
      max_body_bytes: the largest body taken.

    Raises:
      OSError: when the port cannot be bound.
    """

    def __init__(self, app, host, port, threads, max_body_bytes):
        import waitress

        self.draining = threading.Event()
        self._running, self._last = 0, time.monotonic()
        self._idle = threading.Condition()

        def counted(environ, start_response):
            with self._idle:
                self._running += 1
            try:
                return app(environ, start_response)
            finally:
                with self._idle:
                    self._running -= 1
                    self._last = time.monotonic()
                    self._idle.notify_all()

        self._server = waitress.create_server(
            counted,
            host=host,
            port=port,
            threads=threads,
            max_request_body_size=max_body_bytes + 1,
            # Waitress's default of 100 leaves the 101st keep-alive client waiting in the
            # backlog, unanswered; TF Serving's server sets no such limit.
            connection_limit=CONNECTION_LIMIT,
            ident="sat-serve",
        )
        self._server.channel_class = _channel_class(self, max_body_bytes)
        self.port = self._server.effective_port
        self._thread = threading.Thread(target=self._server.run, name="rest", daemon=True)
        self._thread.start()

    def stop_accepting(self) -> None:
        """Closes the listening socket; open connections are answered, then closed."""
        from waitress import wasyncore

        closed = threading.Event()

        def close_listener():
            self._server.accepting = False
            wasyncore.dispatcher.close(self._server)
            # Only now: a client told to close reconnects to a closed port (refused), never
            # to a backlog that is about to be reset.
            self.draining.set()
            closed.set()

        self._server.trigger.pull_trigger(close_listener)
        closed.wait(5)
        self.draining.set()
        with self._idle:
            self._last = time.monotonic()

    def stop(self, grace_seconds: float) -> None:
        """Waits (at most `grace_seconds`) until no request runs and none came for
        `QUIET_SECONDS`, lets waitress write the last answers, and closes everything."""
        deadline = time.monotonic() + grace_seconds
        with self._idle:
            while time.monotonic() < deadline:
                quiet = self._last + QUIET_SECONDS - time.monotonic()
                if not self._running and quiet <= 0:
                    break
                self._idle.wait(max(0.01, min(quiet, deadline - time.monotonic())))
        left = max(0.0, deadline - time.monotonic())
        # Waitress's threads hand the last answers to its loop, which writes them out; only
        # then may its wake-up pipe close (a thread pulling it after would fail).
        self._server.task_dispatcher.shutdown(cancel_pending=False, timeout=left)
        while time.monotonic() < deadline and any(
            c.total_outbufs_len for c in list(self._server.active_channels.values())
        ):
            time.sleep(0.01)
        self._server.close()
