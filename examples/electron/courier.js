'use strict'
// The protocol wiring of the app: where the database lives, where its identity seal key comes
// from, where relay tokens come from, where events go, and what the app lifecycle calls. It
// holds no Electron code: `main.js` (or `utility.js`) hands in what Electron provides, so the
// same module runs in the main process, in a utilityProcess, and in the repository's Node test
// (`__test__/electron-wiring.test.mjs`).

const { randomBytes } = require('node:crypto')
const { existsSync } = require('node:fs')
const path = require('node:path')

const SEAL_KEY_BYTES = 32

/**
 * Why the courier could not start, when the cause is this app's own setup rather than the
 * protocol: `code` is `DATABASE_IN_USE` (another instance holds the database),
 * `SEAL_KEY_MISSING` (the database exists but its seal key is gone) or `SEAL_KEY_INVALID`
 * (the store returned something that is not 32 bytes).
 */
class CourierStartError extends Error {
  constructor(code, message, options) {
    super(message, options)
    this.name = 'CourierStartError'
    this.code = code
  }
}

/**
 * The key that seals this device's identity at rest, created on the first run. It is written
 * to the store before the database exists: a database never outlives the only copy of its key
 * because of a crash between the two.
 */
async function loadSealKey(store, dbPath) {
  const stored = await store.read()
  if (stored !== null) {
    if (!(stored instanceof Uint8Array) || stored.length !== SEAL_KEY_BYTES) {
      throw new CourierStartError('SEAL_KEY_INVALID', `the seal key store returned ${stored?.length ?? typeof stored} bytes, not ${SEAL_KEY_BYTES}`)
    }
    return stored
  }
  if (existsSync(dbPath)) {
    // A new key would not open the existing identity (`start()` would refuse it with
    // ERR_STORAGE) and would hide what actually happened.
    throw new CourierStartError(
      'SEAL_KEY_MISSING',
      `${dbPath} exists but its seal key is gone (was the key file deleted, or the OS keychain reset?). ` +
        'The identity cannot be opened without it; removing the database starts a new identity.',
    )
  }
  const key = randomBytes(SEAL_KEY_BYTES)
  await store.write(key)
  return key
}

/**
 * Starts this device's courier.
 *
 * @param {object} options
 * @param {string} options.userData the app's own directory (`app.getPath('userData')`)
 * @param {{ read(): Uint8Array | null | Promise<Uint8Array | null>, write(key: Buffer): void | Promise<void> }} options.sealKeyStore
 *   where the identity seal key is kept (in the app: `safeStorage` over a file)
 * @param {string} options.relayUrl the relay's `wss://` URL
 * @param {() => string | Promise<string>} options.authToken asked for a fresh relay token at every connect
 * @param {(event: object) => void} options.onEvent receives every protocol event
 * @param {object} [options.logger] pino, console, …: receives the diagnostics
 * @param {string} [options.appId]
 * @param {typeof import('offline-courier')} [options.offlineCourier] the package itself; the
 *   repository's test passes its own build, an app leaves it out
 */
async function startCourier({
  userData,
  sealKeyStore,
  relayUrl,
  authToken,
  onEvent,
  logger,
  appId = 'electron-example',
  offlineCourier = require('offline-courier'),
}) {
  const dbPath = path.join(userData, 'courier.db')
  const identitySealKey = await loadSealKey(sealKeyStore, dbPath)
  const protocol = new offlineCourier.Protocol({
    appId,
    storage: { path: dbPath, identitySealKey },
    transports: { internet: { url: relayUrl, authToken } },
    ...(logger ? { logger } : {}),
  })
  // Before start(): `identity_ready` is the first event of every start.
  protocol.onEvent(onEvent)
  try {
    await protocol.start()
  } catch (e) {
    // The storage lock is the only ERR_STORAGE whose message says "is locked"; the protocol
    // gives it no code of its own.
    if (e.code === 'ERR_STORAGE' && / is locked: /.test(e.message)) {
      throw new CourierStartError(
        'DATABASE_IN_USE',
        `${dbPath} is in use by another running instance of this app. One instance per database: ` +
          'app.requestSingleInstanceLock() lets a second launch hand over to the first instead of getting here.',
        { cause: e },
      )
    }
    throw e
  }

  return {
    /** This device's `off1…` address: what other devices send to. */
    address: protocol.localAddress(),
    /** Resolves with the message id once the message is durably in the outbox. */
    send: (to, text) => protocol.sendMessage(to, text),
    /** The OS resumed from sleep: the relay socket may be dead without anyone knowing yet. */
    resume: () => protocol.reconnect(),
    /** The renderer's `online`/`offline` events. */
    networkHint: (online) => protocol.internetStatusChanged(online),
    /** Stops timers and carriers and releases the database; stopping twice does nothing. */
    stop: () => protocol.stop(),
  }
}

module.exports = { startCourier, CourierStartError, SEAL_KEY_BYTES }
