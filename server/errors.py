"""Errors the API answers with; each becomes ``{"code": status, "message": ..., "data": {}}``.

ApiError (500)
├── BadRequestError (400)          malformed or invalid request
│   └── TargetUnreachableError     the target Milvus did not answer within connect_timeout
├── UnauthorizedError (401)        no token, or not a valid one
├── ForbiddenError (403)           the token's role may not take the action
├── NotFoundError (404)            unknown task id or path
├── MethodNotAllowedError (405)
├── ConflictError (409)            the request clashes with a task's state or another task
├── PayloadTooLargeError (413)
└── UnavailableError (503)         metastore down or the daemon draining (retriable)
"""

from __future__ import annotations


class ApiError(Exception):
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequestError(ApiError):
    status = 400


class TargetUnreachableError(BadRequestError):
    pass


class UnauthorizedError(ApiError):
    status = 401


class ForbiddenError(ApiError):
    status = 403


class NotFoundError(ApiError):
    status = 404


class MethodNotAllowedError(ApiError):
    status = 405


class ConflictError(ApiError):
    status = 409


class PayloadTooLargeError(ApiError):
    status = 413


class UnavailableError(ApiError):
    status = 503
