// A desktop app stays open for days: relay tokens expire, sockets die silently across sleep.
// `authToken` as a provider is asked at every connect, `auth_failed` says why a token was
// refused, and `reconnect()` replaces a dead socket at once (docs/protocol.md#reconnection).
import assert from 'node:assert/strict'
import { createServer, connect } from 'node:net'
import { test } from 'node:test'

import { issueToken } from '../js/index.js'
import { SECRET, connected, ofType, peerConfig, startRelay, started, tempDir, waitFor } from './helpers.mjs'

/**
 * A TCP proxy on a loopback port in front of `target` (`host:port`). `cut()` closes every
 * connection through it, as a network drop would; `freeze()` stops forwarding on them without
 * closing anything, as a socket that died during sleep. New connections forward normally.
 */
async function tcpProxy(t, target) {
  const [host, port] = target.split(':')
  const pairs = new Set()
  const server = createServer((client) => {
    const upstream = connect(Number(port), host)
    const pair = { client, upstream }
    pairs.add(pair)
    client.pipe(upstream)
    upstream.pipe(client)
    const drop = () => {
      pairs.delete(pair)
      client.destroy()
      upstream.destroy()
    }
    client.on('error', drop).on('close', drop)
    upstream.on('error', drop).on('close', drop)
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.after(() => {
    for (const { client, upstream } of pairs) {
      client.destroy()
      upstream.destroy()
    }
    server.close()
  })
  return {
    url: `ws://127.0.0.1:${server.address().port}`,
    cut() {
      for (const { client, upstream } of [...pairs]) {
        client.destroy()
        upstream.destroy()
      }
    },
    freeze() {
      for (const { client, upstream } of [...pairs]) {
        client.unpipe(upstream)
        upstream.unpipe(client)
        client.pause()
        upstream.pause()
      }
    },
  }
}

const relayAddress = (relay) => new URL(relay.url).host

test('with a token provider, a send after the first token expired is delivered with no app intervention', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const proxy = await tcpProxy(t, relayAddress(relay))
  const bob = await started(t, peerConfig('bob', dir, relay.url))

  // Every token lives 2 s; the provider is asked at every connect.
  let asked = 0
  const provider = async () => {
    asked += 1
    return issueToken(SECRET, 'alice', { expiresInSec: 2 })
  }
  const alice = await started(t, peerConfig('alice', dir, proxy.url, { transports: { internet: { url: proxy.url, authToken: provider } } }))
  // The same 2 s token, fixed, for a device that cannot renew it.
  const carol = await started(t, peerConfig('carol', dir, proxy.url, {
    transports: { internet: { url: proxy.url, authToken: issueToken(SECRET, 'carol', { expiresInSec: 2 }) } },
  }))
  assert.equal(asked, 1)

  // Both tokens are past their expiry; then the network drops every connection through the proxy.
  await new Promise((resolve) => setTimeout(resolve, 5_000))
  const mark = alice.recorder.events.length
  proxy.cut()
  await waitFor(alice.recorder, (e) => alice.recorder.events.indexOf(e) >= mark && connected(e), { what: 'alice back online' })
  assert.ok(asked >= 2, 'the reconnect asked the provider for a fresh token')
  const id = await alice.protocol.sendMessage('bob', 'after five seconds')
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id)
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id)
  assert.deepEqual(ofType(alice.recorder, 'auth_failed'), [])

  // The fixed token is refused, typed: the app learns why and when the carrier tries again.
  const failed = await waitFor(carol.recorder, (e) => e.type === 'auth_failed', { what: "carol's auth_failed" })
  assert.deepEqual(failed, { type: 'auth_failed', reason: 'token_expired', message: null, retryInMs: 30_000 })
  // A new token ends the wait at once.
  carol.protocol.setAuthToken(issueToken(SECRET, 'carol'))
  const back = carol.recorder.events.length
  await waitFor(carol.recorder, (e) => carol.recorder.events.indexOf(e) >= back && connected(e), { what: 'carol back online' })
})

test('a provider that fails is reported with its reason and asked again', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  let calls = 0
  const provider = () => {
    calls += 1
    if (calls === 1) throw new Error('the identity provider is down')
    if (calls === 2) return 42
    return issueToken(SECRET, 'alice')
  }
  const alice = await started(t, peerConfig('alice', dir, relay.url, { transports: { internet: { url: relay.url, authToken: provider } } }))
  const failures = ofType(alice.recorder, 'auth_failed')
  assert.deepEqual(
    failures.map((e) => [e.reason, e.message]),
    [
      ['token_unavailable', 'the identity provider is down'],
      ['token_unavailable', 'the token provider returned number, not a string'],
    ],
  )
  assert.ok(failures.every((e) => e.retryInMs > 0 && e.retryInMs < 30_000))
  assert.throws(() => alice.protocol.setAuthToken(issueToken(SECRET, 'alice')), { code: 'ERR_INVALID_ARGUMENT' })
  assert.throws(() => alice.protocol.setAuthToken(5), { code: 'ERR_INVALID_ARGUMENT' })
})

test('reconnect() replaces a silently dead socket at once, long before the keepalive would notice', async (t) => {
  const dir = tempDir(t)
  const relay = await startRelay(t)
  const proxy = await tcpProxy(t, relayAddress(relay))
  const bob = await started(t, peerConfig('bob', dir, relay.url))
  const alice = await started(t, peerConfig('alice', dir, proxy.url))

  // The socket is dead, and nothing says so: no close, no error.
  proxy.freeze()
  const id = await alice.protocol.sendMessage('bob', 'after the resume')
  alice.protocol.reconnect()
  // The keepalive would take 30 s to notice; this deadline is far below that.
  await waitFor(bob.recorder, (e) => e.type === 'message_received' && e.messageId === id, { timeoutMs: 8_000 })
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === id, { timeoutMs: 8_000 })
})
