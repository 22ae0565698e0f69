'use strict'
// `ProtocolError`, the one error type of the package, and the wrapping of native errors into it.

class ProtocolError extends Error {
  constructor(code, message, options) {
    super(message, options)
    this.name = 'ProtocolError'
    this.code = code
  }
}

// The native side sets each error's stable code as its `code`; anything else (napi-rs's own
// argument conversion errors, whose codes are napi statuses) is an internal error. The native
// error stays reachable as `cause`, with its stack.
function toProtocolError(e) {
  if (e instanceof ProtocolError) return e
  const message = String((e && e.message) || e)
  const code = typeof e?.code === 'string' && e.code.startsWith('ERR_') ? e.code : 'ERR_INTERNAL'
  return new ProtocolError(code, message, { cause: e })
}

async function call(promise) {
  try {
    return await promise
  } catch (e) {
    throw toProtocolError(e)
  }
}

function callSync(fn) {
  try {
    return fn()
  } catch (e) {
    throw toProtocolError(e)
  }
}

const invalid = (message) => new ProtocolError('ERR_INVALID_ARGUMENT', message)

module.exports = { ProtocolError, call, callSync, invalid, toProtocolError }
