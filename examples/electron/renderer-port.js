'use strict'
// The window's line to the courier: a MessagePortMain whose other end the preload script holds.
// The same code serves it in the main process and in the utilityProcess, so the renderer does
// not know where the courier runs. Messages:
//   to the renderer:   { address } once per port, { event } for every protocol event,
//                      { reply: id, messageId } or { reply: id, error: { code, message } }
//   from the renderer: { id, call: 'send', to, text }

/** Serves one window: each reload of the page brings a new port, which replaces the old one. */
function rendererLink() {
  let current = null
  return {
    /** Hands a protocol event to the page showing now, if any (events are not kept for later). */
    forward(event) {
      current?.postMessage({ event })
    },
    /** Serves `port` from `courier` (what `startCourier` returned). */
    attach(port, courier) {
      current?.close()
      current = port
      port.on('message', ({ data }) => answer(port, courier, data))
      port.on('close', () => {
        if (current === port) current = null
      })
      port.start()
      port.postMessage({ address: courier.address })
    },
  }
}

async function answer(port, courier, request) {
  try {
    if (request?.call !== 'send') throw Object.assign(new Error(`unknown call ${JSON.stringify(request?.call)}`), { code: 'UNKNOWN_CALL' })
    port.postMessage({ reply: request.id, messageId: await courier.send(request.to, request.text) })
  } catch (e) {
    port.postMessage({ reply: request?.id, error: { code: e.code, message: e.message } })
  }
}

module.exports = { rendererLink }
