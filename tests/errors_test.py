"""Tests for sat_tf.server.errors: the canonical code -> HTTP table is TF Serving's
(model_servers/http_server.cc, written out here by hand), every TensorFlow error keeps the
code it was raised with, out of memory is RESOURCE_EXHAUSTED, and a bug of the server
becomes INTERNAL without its text, which goes to the log with the traceback."""

import logging

import tensorflow as tf
from absl.testing import parameterized

from sat_tf.server import errors

# TF Serving's ToHTTPStatusCode, case by case.
TF_SERVING = {
    "OK": 200,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}


class ErrorsTest(parameterized.TestCase, tf.test.TestCase):
    def test_codes_are_numbered_as_grpc_numbers_them(self):
        import grpc

        for number, name in enumerate(errors.CODES):
            self.assertEqual(getattr(grpc.StatusCode, name).value[0], number)

    def test_the_http_table_is_tf_servings(self):
        self.assertEqual({c: errors.http_status(c) for c in errors.CODES}, TF_SERVING)
        self.assertEqual(errors.ServingError("UNAVAILABLE", "busy").http_status, 503)

    @parameterized.parameters(
        (tf.errors.ResourceExhaustedError, "RESOURCE_EXHAUSTED"),
        (tf.errors.InvalidArgumentError, "INVALID_ARGUMENT"),
        (tf.errors.DeadlineExceededError, "DEADLINE_EXCEEDED"),
        (tf.errors.DataLossError, "DATA_LOSS"),
        (tf.errors.NotFoundError, "NOT_FOUND"),
        (tf.errors.UnavailableError, "UNAVAILABLE"),
        (tf.errors.FailedPreconditionError, "FAILED_PRECONDITION"),
        (tf.errors.OutOfRangeError, "OUT_OF_RANGE"),
        (tf.errors.UnimplementedError, "UNIMPLEMENTED"),
    )
    def test_a_tensorflow_error_keeps_its_code(self, kind, code):
        got = errors.from_exception(kind(None, None, "OOM when allocating tensor\n  more"))
        self.assertEqual((got.code, got.message), (code, "OOM when allocating tensor"))

    def test_out_of_memory_in_python(self):
        got = errors.from_exception(MemoryError())
        self.assertEqual((got.code, got.http_status), ("RESOURCE_EXHAUSTED", 429))

    def test_a_bug_is_internal_and_logged_not_answered(self):
        with self.assertLogs("sat_tf.server.errors", logging.ERROR) as logs:
            try:
                {}["secret key"]
            except KeyError as e:
                got = errors.from_exception(e, "the predict of sat")
        self.assertEqual(got.code, "INTERNAL")
        self.assertNotIn("secret", got.message)
        self.assertNotIn("KeyError", got.message)
        (line,) = logs.output
        self.assertIn("the predict of sat failed", line)
        self.assertIn("Traceback", line)
        self.assertIn("KeyError: 'secret key'", line)

    def test_files_that_are_not_there_or_not_allowed(self):
        got = errors.from_exception(FileNotFoundError("no /m/1/variables/variables.index"))
        self.assertEqual(
            (got.code, got.message), ("NOT_FOUND", "no /m/1/variables/variables.index")
        )
        self.assertEqual(errors.from_exception(PermissionError("x")).code, "PERMISSION_DENIED")

    def test_a_loads_unknown_error_keeps_its_first_line(self):
        with self.assertLogs("sat_tf.server.errors", logging.ERROR):
            got = errors.from_exception(ValueError("no meta graph\n  detail"), "load", load=True)
        self.assertEqual((got.code, got.message), ("UNKNOWN", "ValueError: no meta graph"))

    def test_a_serving_error_passes_through(self):
        error = errors.ServingError("NOT_FOUND", "no model")
        self.assertIs(errors.from_exception(error), error)
        self.assertEqual(str(error), "NOT_FOUND: no model")
        with self.assertRaisesRegex(ValueError, "'NOPE' is not a canonical status code"):
            errors.ServingError("NOPE", "x")

    def test_an_assertion_gives_its_text_and_others_their_first_line(self):
        @tf.function
        def refuse(n):
            with tf.control_dependencies([tf.debugging.Assert(n > 0, ["image_bytes[0] is empty"])]):
                return n + 1

        with self.assertRaises(tf.errors.InvalidArgumentError) as raised:
            refuse(tf.constant(0))
        self.assertStartsWith(raised.exception.message, "Graph execution error:")
        self.assertEqual(errors.error_line(raised.exception), "image_bytes[0] is empty")
        got = errors.from_exception(raised.exception)
        self.assertEqual((got.code, got.message), ("INVALID_ARGUMENT", "image_bytes[0] is empty"))
        self.assertEqual(errors.error_line(ValueError("bad shape\n  more")), "bad shape")
        self.assertEqual(errors.error_line(ValueError("")), "")


if __name__ == "__main__":
    tf.test.main()
