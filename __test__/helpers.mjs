// Shared test plumbing: temp dirs, a real relay on loopback, peers in child processes that
// speak line-delimited JSON, and waiting with deadlines (never fixed sleeps).
import { spawn, spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'

import { Protocol, Relay, issueToken } from '../js/index.js'

export const SECRET = 'test-secret-0123456789abcdef-0123'
const PEER = fileURLToPath(new URL('./fixtures/peer.mjs', import.meta.url))

export function tempDir(t) {
  const dir = mkdtempSync(join(tmpdir(), 'courier-test-'))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

export async function startRelay(t, options = {}) {
  const relay = await Relay.start({ listen: '127.0.0.1:0', storage: { memory: true }, jwtSecret: SECRET, ...options })
  t.after(() => relay.stop())
  return relay
}

export function token(account) {
  return issueToken(SECRET, account)
}

/**
 * Plaintext mode: tests of delivery itself address peers by account name, which only plaintext
 * mode allows (`encryption.test.mjs` covers the default, sealed mode).
 */
export const PLAINTEXT = Object.freeze({ enabled: false })

export function peerConfig(name, dir, relayUrl, extra = {}) {
  return {
    appId: 'test',
    storage: { path: join(dir, `${name}.db`) },
    transports: { internet: { url: relayUrl, authToken: token(name) } },
    encryption: PLAINTEXT,
    ...extra,
  }
}

/** A device as an app configures it by default, sealed end to end (no `encryption` key). */
export function sealedConfig(name, dir, relayUrl, extra = {}) {
  const { encryption, ...config } = peerConfig(name, dir, relayUrl, { logLevel: 'info', ...extra })
  void encryption
  return config
}

/** The diagnostic that says a sealed device's key packages are in the relay's directory. */
export const keyPackagesPublished = (e) => e.type === 'diagnostic' && e.message.includes('holds 10 one-time')

/**
 * A started sealed device (see `started`) whose key packages are in the relay's directory, so a
 * message to it is sealed at once; with its `name`, `config` and `address`.
 */
export async function sealedDevice(t, name, dir, relayUrl, extra = {}) {
  const config = sealedConfig(name, dir, relayUrl, extra)
  const peer = await started(t, config)
  await waitFor(peer.recorder, keyPackagesPublished, { what: `${name}'s key packages in the directory` })
  return { ...peer, name, config, address: peer.protocol.localAddress() }
}

/** The address of a device that is never started again: no relay or carrier knows it. */
export async function strayAddress() {
  const device = new Protocol({ appId: 'test', storage: { memory: true } })
  await device.start()
  const address = device.localAddress()
  await device.stop()
  return address
}

/** A frame from `mallory` to `recipient` that claims to be sealed in an MLS session. */
export function sealedFrame(recipient) {
  return JSON.stringify({
    id: 'sealed-1', sender: 'mallory', recipient, app_id: 'test', priority: 'medium',
    ttl: 5, hop_count: 0, timestamp: 0, lamport_clock: 0, content_type: 'text', content: '__MLS_ENC__AAAA',
    metadata: {}, requires_ack: true, reply_to_msg: null,
  })
}

/** A connection-request control frame from `mallory` to `recipient` that carries no signature. */
export function unsignedControlFrame(recipient) {
  return JSON.stringify({
    id: 'forged-1', sender: 'mallory', recipient, app_id: 'test', priority: 'high',
    ttl: 5, hop_count: 0, timestamp: Date.now(), lamport_clock: 1, content_type: 'text', content: '__CONN_REQ__{}',
    metadata: {}, requires_ack: true, reply_to_msg: null,
  })
}

/** Compiles `source` (TypeScript) with tsc, strict, in a temporary folder; returns tsc's result. */
export function typeCheck(source) {
  const dir = mkdtempSync(join(tmpdir(), 'courier-tsc-'))
  try {
    writeFileSync(join(dir, 'check.ts'), source)
    const compilerOptions = { strict: true, noEmit: true, skipLibCheck: true, target: 'es2022', module: 'node16', moduleResolution: 'node16', types: [] }
    writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({ compilerOptions, files: ['check.ts'] }))
    const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc')
    return spawnSync(process.execPath, [tsc, '-p', dir], { encoding: 'utf8' })
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

/** Resolves when `predicate` holds for an event seen (past or future) by `recorder`. */
export function waitFor(recorder, predicate, { timeoutMs = 10_000, what = 'event' } = {}) {
  return new Promise((resolve, reject) => {
    const found = recorder.events.find(predicate)
    if (found) return resolve(found)
    const timer = setTimeout(() => {
      recorder.waiters.delete(check)
      reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}; saw ${JSON.stringify(recorder.events.map((e) => e.type))}`))
    }, timeoutMs)
    const check = (event) => {
      if (!predicate(event)) return
      clearTimeout(timer)
      recorder.waiters.delete(check)
      resolve(event)
    }
    recorder.waiters.add(check)
  })
}

/** Resolves once `predicate()` holds, checking every 10 ms; rejects after `timeoutMs`. */
export async function until(predicate, { timeoutMs = 10_000, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

/** Records a Protocol's events for later assertions and waits. */
export function record(protocol) {
  const recorder = { events: [], waiters: new Set() }
  protocol.onEvent((event) => {
    recorder.events.push(event)
    for (const waiter of [...recorder.waiters]) waiter(event)
  })
  return recorder
}

export const ofType = (recorder, type) => recorder.events.filter((e) => e.type === type)

export const connected = (e) => e.type === 'internet_status_changed' && e.connected

/** A started Protocol with its event recorder, stopped after the test; by default connected to the relay. */
export async function started(t, config, { connect = true } = {}) {
  const protocol = new Protocol(config)
  const recorder = record(protocol)
  await protocol.start()
  t.after(() => protocol.stop())
  if (connect) await waitFor(recorder, connected)
  return { protocol, recorder }
}

/** A peer in its own process: it prints each event as a JSON line and takes commands on stdin. */
export class PeerProcess {
  constructor(config, env = {}) {
    this.recorder = { events: [], waiters: new Set() }
    this.replies = { events: [], waiters: new Set() }
    this.hooks = { events: [], waiters: new Set() }
    this.child = spawn(process.execPath, [PEER], {
      env: { ...process.env, PEER_CONFIG: JSON.stringify(config), ...env },
      stdio: ['pipe', 'pipe', 'inherit'],
    })
    this.exited = new Promise((resolve) => this.child.once('exit', (code, signal) => resolve({ code, signal })))
    createInterface({ input: this.child.stdout }).on('line', (line) => {
      let msg
      try {
        msg = JSON.parse(line)
      } catch {
        return
      }
      const target = msg.event ? this.recorder : msg.hook ? this.hooks : this.replies
      const item = msg.event ?? msg.hook ?? msg
      target.events.push(item)
      for (const waiter of [...target.waiters]) waiter(item)
    })
  }

  async request(cmd, timeoutMs = 15_000) {
    const nonce = Math.random().toString(36).slice(2)
    this.child.stdin.write(`${JSON.stringify({ ...cmd, nonce })}\n`)
    const reply = await waitFor(this.replies, (r) => r.nonce === nonce, { timeoutMs, what: `reply to ${cmd.cmd}` })
    if (reply.error) {
      const err = new Error(reply.error.message)
      err.code = reply.error.code
      throw err
    }
    return reply.result
  }

  waitFor(predicate, options) {
    return waitFor(this.recorder, predicate, options)
  }

  kill() {
    this.child.kill('SIGKILL')
    return this.exited
  }
}
