'use strict'
// The Electron main process: one instance per userData folder, the window, and the lifecycle
// calls into the courier (resume from sleep, network hints, a clean stop on quit). The courier
// runs here, or with COURIER_IN_UTILITY=1 in a utilityProcess (utility.js); both use courier.js.

const path = require('node:path')
const { app, BrowserWindow, MessageChannelMain, dialog, ipcMain, net, powerMonitor, utilityProcess } = require('electron')

const { startCourier } = require('./courier')
const { rendererLink } = require('./renderer-port')
const { safeStorageKeyStore } = require('./seal-key-store')

const IN_UTILITY = process.env.COURIER_IN_UTILITY === '1'
// PLACEHOLDER: your relay. `ws://` is accepted only for loopback hosts.
const RELAY_URL = process.env.COURIER_RELAY_URL ?? 'wss://relay.example.com'
const STOP_DEADLINE_MS = 10_000

/**
 * PLACEHOLDER: your backend. Asked for a fresh relay token at every connect, so an app that
 * stays open for weeks never presents an expired one. The backend knows the signed-in user and
 * holds the relay's JWT secret (it calls `issueToken(secret, account)`); the secret never ships
 * in the app. A throw here is reported as `auth_failed` (`token_unavailable`) and asked again.
 */
async function fetchRelayToken() {
  const url = process.env.COURIER_TOKEN_URL
  if (!url) throw new Error('COURIER_TOKEN_URL is not set: there is no backend to ask for a relay token')
  // net.fetch goes through Chromium's network stack: the system proxy settings apply.
  const response = await net.fetch(url, { method: 'POST' })
  if (!response.ok) throw new Error(`the token endpoint answered ${response.status}`)
  const { token } = await response.json()
  return token
}

// Two copies of the app on one machine (two devices to try it with) need two userData folders.
// Set before the single-instance lock, which is taken per userData folder.
if (process.env.COURIER_USER_DATA) app.setPath('userData', path.resolve(process.env.COURIER_USER_DATA))

/** The running courier, wherever it runs: `{ connectRenderer(port), resume(), networkHint(online), stop() }`. */
let backend = null
/** Set once quitting began: the courier's stop, and then whether it finished. */
let stopping = null
let stopped = false
let mainWindow = null

// One instance per database: a second launch hands over to the first and quits. Without this
// it would reach `start()` and be refused (the database is locked while the first one runs).
if (!app.requestSingleInstanceLock()) {
  app.quit()
} else {
  app.on('second-instance', () => {
    if (!backend) return // still starting: the window comes when the courier is up
    if (!mainWindow) mainWindow = createWindow()
    else if (mainWindow.isMinimized()) mainWindow.restore()
    mainWindow.focus()
  })
  app.whenReady().then(ready).catch(fail)
}

async function ready() {
  try {
    const userData = app.getPath('userData')
    backend = IN_UTILITY ? await startInUtility(userData) : await startInMain(userData)
  } catch (e) {
    return fail(e)
  }
  // Sleep can leave the relay socket dead without either side knowing for ~30 s; redial now.
  powerMonitor.on('resume', () => {
    if (!stopping) backend.resume()
  })
  ipcMain.on('network-hint', (event, online) => {
    if (!stopping && event.sender === mainWindow?.webContents && typeof online === 'boolean') backend.networkHint(online)
  })
  mainWindow = createWindow()
  // macOS keeps the app (and the courier, still receiving) running with no window open.
  app.on('activate', () => {
    if (BrowserWindow.getAllWindows().length === 0) mainWindow = createWindow()
  })
}

function createWindow() {
  const win = new BrowserWindow({
    width: 760,
    height: 600,
    webPreferences: {
      preload: path.join(__dirname, 'preload.js'),
      // The page gets `window.courier` from the preload and nothing else: no Node, no addon.
      contextIsolation: true,
      sandbox: true,
    },
  })
  // Every load of the page (a reload too) gets a fresh port to the courier.
  win.webContents.on('did-finish-load', () => {
    const { port1, port2 } = new MessageChannelMain()
    backend?.connectRenderer(port1)
    win.webContents.postMessage('courier:port', null, [port2])
  })
  win.on('closed', () => {
    if (mainWindow === win) mainWindow = null
  })
  win.loadFile(path.join(__dirname, 'index.html'))
  return win
}

async function startInMain(userData) {
  const link = rendererLink()
  const courier = await startCourier({
    userData,
    sealKeyStore: await safeStorageKeyStore(userData),
    relayUrl: RELAY_URL,
    authToken: fetchRelayToken,
    onEvent: link.forward,
    logger: console,
  })
  return {
    connectRenderer: (port) => link.attach(port, courier),
    resume: courier.resume,
    networkHint: courier.networkHint,
    stop: courier.stop,
  }
}

/**
 * The courier in its own process: every event is parsed there and goes straight to the window
 * over its port, so heavy inbound traffic never queues behind the main process's work. Main
 * keeps what only it can do: safeStorage, and the app's session for relay tokens.
 */
async function startInUtility(userData) {
  const keyStore = await safeStorageKeyStore(userData)
  const sealKey = await keyStore.read()
  const child = utilityProcess.fork(path.join(__dirname, 'utility.js'), [], { serviceName: 'offline-courier' })
  let alive = true
  let stopRequested = false
  const exited = new Promise((resolve) => child.once('exit', resolve))
  exited.then(() => {
    alive = false
  })
  const post = (message, transfer) => {
    if (alive) child.postMessage(message, transfer)
  }

  const started = new Promise((resolve, reject) => {
    child.on('message', (message) => {
      if (message.type === 'started') resolve()
      else if (message.type === 'start-failed') reject(Object.assign(new Error(message.message), { code: message.code }))
      else if (message.type === 'seal-key-write') reply(message.id, () => keyStore.write(Buffer.from(message.key)))
      else if (message.type === 'token-request') reply(message.id, fetchRelayToken)
    })
    exited.then((code) => reject(new Error(`the courier process exited (code ${code}) before it started`)))
  })
  async function reply(id, work) {
    try {
      post({ type: 'reply', id, value: await work() })
    } catch (e) {
      post({ type: 'reply', id, error: e.message })
    }
  }

  post({ type: 'start', userData, sealKey, relayUrl: RELAY_URL })
  try {
    await started
  } catch (e) {
    child.kill()
    throw e
  }
  exited.then((code) => {
    if (stopRequested) return
    // A production app would fork again: the database lock died with the process.
    dialog.showErrorBox('offline-courier stopped', `The courier process exited unexpectedly (code ${code}).`)
    app.quit()
  })
  return {
    connectRenderer: (port) => post({ type: 'renderer' }, [port]),
    resume: () => post({ type: 'resume' }),
    networkHint: (online) => post({ type: 'network-hint', online }),
    async stop() {
      stopRequested = true
      post({ type: 'stop' })
      // Killing it loses nothing (the storage is crash-safe); it only must not hold the quit forever.
      const deadline = setTimeout(() => child.kill(), STOP_DEADLINE_MS)
      await exited
      clearTimeout(deadline)
    },
  }
}

// Quit waits for the courier to stop: its storage is crash-safe, so this is about closing the
// relay connection and releasing the database promptly, not about losing messages.
app.on('before-quit', (event) => {
  if (!backend || stopped) return
  event.preventDefault()
  stopping ??= backend
    .stop()
    .catch((e) => console.error('offline-courier did not stop cleanly:', e))
    .finally(() => {
      stopped = true
      app.quit()
    })
})

app.on('window-all-closed', () => {
  if (process.platform !== 'darwin') app.quit()
})

function fail(e) {
  console.error(e)
  dialog.showErrorBox('offline-courier could not start', e.message)
  app.quit()
}
