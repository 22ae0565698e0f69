'use strict'
// The courier in an Electron utilityProcess (main.js forks it when COURIER_IN_UTILITY=1). It runs
// the same courier.js as the main process would; what only the main process has (safeStorage,
// the app's session for relay tokens) it asks for over `process.parentPort`. Messages:
//   from main: { type: 'start', userData, sealKey, relayUrl }, { type: 'renderer' } with the
//              window's port, { type: 'resume' }, { type: 'network-hint', online },
//              { type: 'stop' }, { type: 'reply', id, value | error }
//   to main:   { type: 'started' | 'start-failed', code, message },
//              { type: 'seal-key-write', id, key }, { type: 'token-request', id }

const { startCourier } = require('./courier')
const { rendererLink } = require('./renderer-port')

const parent = process.parentPort
const link = rendererLink()
/** Requests to main waiting for its `reply`, by id. */
const pending = new Map()
let nextRequest = 0
let courier = null

/** Asks main for something only it can do; resolves with its answer. */
function ask(type, fields = {}) {
  const id = ++nextRequest
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject })
    parent.postMessage({ type, id, ...fields })
  })
}

parent.on('message', ({ data, ports }) => {
  switch (data.type) {
    case 'start':
      return start(data)
    case 'reply': {
      const request = pending.get(data.id)
      pending.delete(data.id)
      if (data.error !== undefined) request.reject(new Error(data.error))
      else request.resolve(data.value)
      return
    }
    case 'renderer':
      return link.attach(ports[0], courier)
    case 'resume':
      return courier.resume()
    case 'network-hint':
      return courier.networkHint(data.online)
    case 'stop':
      return courier.stop().finally(() => process.exit(0))
  }
})

async function start({ userData, sealKey, relayUrl }) {
  try {
    courier = await startCourier({
      userData,
      sealKeyStore: {
        read: () => (sealKey === null ? null : Buffer.from(sealKey)),
        // Main encrypts and writes it; the database is created only once main says it is stored.
        write: (key) => ask('seal-key-write', { key }),
      },
      relayUrl,
      authToken: () => ask('token-request'),
      onEvent: link.forward,
      logger: console,
    })
    parent.postMessage({ type: 'started' })
  } catch (e) {
    parent.postMessage({ type: 'start-failed', code: e.code, message: e.message })
  }
}
