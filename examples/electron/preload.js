'use strict'
// The only bridge between the sandboxed page and the courier. A sandboxed renderer cannot load
// a native addon (nor should it hold the database): the courier runs in the main process or a
// utilityProcess, and this script talks to it over the MessagePort main hands in at each load.
// The page gets `window.courier` with three functions, and nothing else of Electron.

const { contextBridge, ipcRenderer } = require('electron')

let port = null
let address = null
let nextRequest = 0
/** `send` calls waiting for their reply, by id. */
const pending = new Map()
const eventListeners = new Set()
const addressListeners = new Set()

ipcRenderer.on('courier:port', (event) => {
  port = event.ports[0]
  // Assigning onmessage starts the port.
  port.onmessage = ({ data }) => {
    if ('address' in data) {
      address = data.address
      for (const listener of addressListeners) listener(address)
    } else if ('event' in data) {
      for (const listener of eventListeners) listener(data.event)
    } else if ('reply' in data) {
      const request = pending.get(data.reply)
      pending.delete(data.reply)
      if (data.error) request?.reject(new Error(`${data.error.code}: ${data.error.message}`))
      else request?.resolve(data.messageId)
    }
  }
})

contextBridge.exposeInMainWorld('courier', {
  /** Resolves with the message id once the message is durably in the outbox. */
  send(to, text) {
    if (port === null) return Promise.reject(new Error('not connected to the courier yet'))
    const id = ++nextRequest
    return new Promise((resolve, reject) => {
      pending.set(id, { resolve, reject })
      port.postMessage({ id, call: 'send', to: String(to), text: String(text) })
    })
  },
  /** Every protocol event, as it happens; returns the unsubscribe function. */
  onEvent(listener) {
    eventListeners.add(listener)
    return () => eventListeners.delete(listener)
  },
  /** This device's address, as soon as it is known. */
  onAddress(listener) {
    addressListeners.add(listener)
    if (address !== null) listener(address)
  },
})

// Chromium knows when the network comes and goes; main does not (net.isOnline() has no event).
const networkHint = () => ipcRenderer.send('network-hint', navigator.onLine)
window.addEventListener('online', networkHint)
window.addEventListener('offline', networkHint)
