'use strict'
// The `logger` option: diagnostics go to the app's own logger. The call is pino's (and bunyan's)
// shape, fields first: `logger.warn({ target }, message)`. pino keeps a string after an object as
// the message; console prints both arguments. winston reads its first argument as the message,
// so it takes the two-line adapter shown in the README.

const { ProtocolError } = require('./error.js')

const METHODS = ['debug', 'info', 'warn', 'error']

/** The `logger` option, checked: an object with the four methods. */
function checkLogger(logger) {
  if (logger === null || typeof logger !== 'object') {
    throw new ProtocolError('ERR_CONFIG', 'logger must be an object with debug, info, warn and error methods')
  }
  for (const method of METHODS) {
    if (typeof logger[method] !== 'function') throw new ProtocolError('ERR_CONFIG', `logger.${method} must be a function`)
  }
  return logger
}

/** Hands a `diagnostic` event to `logger`; a logger that throws is reported, never fatal. */
function log(logger, { level, message, target }) {
  try {
    logger[level]({ target }, message)
  } catch (e) {
    process.emitWarning(`offline-courier logger threw: ${(e && e.stack) || e}`, 'OfflineCourierLoggerError')
  }
}

module.exports = { checkLogger, log }
