// The gateway carrier end to end: Protocols configured with nothing but `transports.gateway`,
// attached to a gateway daemon started in this process on loopback.
import assert from 'node:assert/strict'
import { execFileSync, spawn } from 'node:child_process'
import { createInterface } from 'node:readline'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

import { Gateway, Protocol } from '../js/index.js'
import { PLAINTEXT, ofType, started, tempDir, until, waitFor } from './helpers.mjs'

const attached = (e) => e.type === 'gateway_status_changed' && e.attached
const lost = (e) => e.type === 'gateway_status_changed' && !e.connected

async function startGateway(t, listen = '127.0.0.1:0') {
  const gateway = await Gateway.start({ listen })
  t.after(() => gateway.stop())
  return gateway
}

function gatewayConfig(name, dir, address) {
  return { appId: 'test', storage: { path: `${dir}/${name}.db` }, transports: { gateway: { address } }, encryption: PLAINTEXT }
}

async function attachedPeer(t, name, dir, address) {
  const peer = await started(t, gatewayConfig(name, dir, address), { connect: false })
  await waitFor(peer.recorder, attached, { what: `${name} attached` })
  return peer
}

async function exchange(from, to, text) {
  const id = await from.protocol.sendMessage(to.protocol.localAddress(), text)
  const received = await waitFor(to.recorder, (e) => e.type === 'message_received' && e.messageId === id, { what: `${text} received` })
  assert.equal(received.transport, 'gateway')
  assert.equal(received.content, text)
  assert.equal(received.sender, from.protocol.localAddress())
  const delivered = await waitFor(from.recorder, (e) => e.type === 'message_delivered' && e.messageId === id, { what: `${text} delivered` })
  assert.equal(delivered.transport, 'gateway')
}

test('two devices attached to one gateway deliver both ways', async (t) => {
  const dir = tempDir(t)
  const gateway = await startGateway(t)
  assert.match(gateway.address, /^127\.0\.0\.1:\d+$/)
  const alice = await attachedPeer(t, 'alice', dir, gateway.address)
  const bob = await attachedPeer(t, 'bob', dir, gateway.address)
  assert.equal(gateway.boundAddresses(), 2)
  await until(() => alice.protocol.stats().carriersUp === 1, { what: 'the gateway carrier up' })

  await exchange(alice, bob, 'hello bob')
  await exchange(bob, alice, 'hi alice')
  for (const peer of [alice, bob]) assert.equal(ofType(peer.recorder, 'security_warning').length, 0)
  assert.throws(
    () => alice.protocol.registerTransport('gateway', { send: async () => {} }),
    (e) => e.code === 'ERR_INVALID_ARGUMENT',
  )
})

test('a gateway that requires a token attaches the devices that carry it, and refuses the others', async (t) => {
  const dir = tempDir(t)
  const token = 'a-shared-gateway-token'
  const gateway = await Gateway.start({ requireToken: token })
  t.after(() => gateway.stop())
  const withToken = (name) => {
    const config = gatewayConfig(name, dir, gateway.address)
    config.transports.gateway.token = token
    return config
  }
  const alice = await started(t, withToken('alice'), { connect: false })
  const bob = await started(t, withToken('bob'), { connect: false })
  await waitFor(alice.recorder, attached, { what: 'alice attached' })
  await waitFor(bob.recorder, attached, { what: 'bob attached' })
  await exchange(alice, bob, 'with the token')

  const eve = await started(t, gatewayConfig('eve', dir, gateway.address), { connect: false })
  const refused = await waitFor(eve.recorder, (e) => e.type === 'security_warning', { what: 'the refusal' })
  assert.equal(refused.reasonCode, 'GATEWAY_ADDRESS_DECLARATION_REFUSED')
  assert.equal(gateway.boundAddresses(), 2)
})

test('a gateway that goes away: sends wait, and the carrier attaches again when it is back', async (t) => {
  const dir = tempDir(t)
  const first = await Gateway.start()
  const { address } = first
  const alice = await attachedPeer(t, 'alice', dir, address)
  const bob = await attachedPeer(t, 'bob', dir, address)
  await first.stop()
  await waitFor(alice.recorder, lost, { what: 'alice losing the gateway' })
  await until(() => alice.protocol.stats().carriersUp === 0, { what: 'the gateway carrier down' })

  const id = await alice.protocol.sendMessage(bob.protocol.localAddress(), 'while the gateway was away')
  await waitFor(alice.recorder, (e) => e.type === 'message_deferred' && e.messageId === id)

  // Same port: both devices reconnect on their backoff and attach from scratch.
  const reattached = (r) => r.events.filter(attached).length === 2
  await startGateway(t, address)
  await until(() => reattached(alice.recorder) && reattached(bob.recorder), { timeoutMs: 15_000, what: 'both attached again' })
  // Alice's flush may reach the gateway before bob is back: the gateway keeps no mailbox, so
  // the message is then parked. Bob's own message is a reachability edge that re-drives it.
  await exchange(bob, alice, 'back again')
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)
  const delivered = await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  assert.equal(delivered.transport, 'gateway')
})

test('transports.gateway is validated, naming the path', () => {
  const config = (gateway) => ({ appId: 'test', storage: { memory: true }, transports: { gateway } })
  for (const [gateway, message] of [
    [{ address: 'localhost' }, /^transports\.gateway\.address must be 'host:port'/],
    [{ address: 'localhost:0' }, /^transports\.gateway\.address must end in a port from 1 to 65535/],
    [{ address: 4242 }, /^transports\.gateway\.address must be a string/],
    [{ adress: 'localhost:4242' }, /^transports\.gateway\.adress is not a known option/],
    ['localhost:4242', /^transports\.gateway must be an object/],
  ]) {
    assert.throws(
      () => new Protocol(config(gateway)),
      (e) => e.code === 'ERR_CONFIG' && message.test(e.message),
      JSON.stringify(gateway),
    )
  }
  // Without an address the daemon's default, localhost:4242, is used.
  assert.doesNotThrow(() => new Protocol(config({})))
  assert.doesNotThrow(() => new Protocol(config({ address: '[::1]:4242' })))
})

test('npx courier-relay gateway serves devices and stops on SIGTERM', async (t) => {
  const bin = fileURLToPath(new URL('../js/relay-cli.js', import.meta.url))
  assert.match(execFileSync(process.execPath, [bin, 'gateway', '--help'], { encoding: 'utf8' }), /--listen <ADDR>/)
  assert.throws(
    () => execFileSync(process.execPath, [bin, 'gateway', '--listen', 'nowhere'], { encoding: 'utf8', stdio: 'pipe' }),
    (e) => e.status === 2 && /^courier-relay gateway: /.test(e.stderr),
  )
  const child = spawn(process.execPath, [bin, 'gateway', '--listen', '127.0.0.1:0'], { stdio: ['ignore', 'pipe', 'inherit'] })
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })))
  t.after(() => child.kill('SIGKILL'))
  const line = await new Promise((resolve) => createInterface({ input: child.stdout }).once('line', resolve))
  const address = /^courier-relay gateway listening on (127\.0\.0\.1:\d+)$/.exec(line)?.[1]
  assert.ok(address, `unexpected first line: ${line}`)

  const dir = tempDir(t)
  const alice = await attachedPeer(t, 'alice', dir, address)
  const bob = await attachedPeer(t, 'bob', dir, address)
  await exchange(alice, bob, 'through the command line gateway')
  child.kill('SIGTERM')
  assert.deepEqual(await exited, { code: 0, signal: null })
  await waitFor(alice.recorder, lost, { what: 'the gateway gone' })
})
