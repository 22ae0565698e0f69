// `courier-relay inspect`: a client database's ledgers drawn as an HTML page, rendered in
// headless Chromium, and the screenshot's pixels checked for a lane per peer and the marks of
// what happened in each (docs/delivery.md#a-messages-life).
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { join } from 'node:path'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

import { PNG } from 'pngjs'

import { Protocol } from '../js/index.js'
import { CHROMIUM, screenshot } from '../scripts/screenshot.mjs'
import { connected, peerConfig, record, startRelay, started, tempDir, until, waitFor } from './helpers.mjs'

const require = createRequire(import.meta.url)
const { layout, MARKS } = require('../js/inspect.js')
const native = require('../js/binding.js')
const CLI = fileURLToPath(new URL('../js/relay-cli.js', import.meta.url))

const rgb = (hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16))

function pixel(png, x, y) {
  const i = (png.width * y + x) * 4
  return [png.data[i], png.data[i + 1], png.data[i + 2]]
}

const near = (a, b, tolerance = 6) => a.every((v, i) => Math.abs(v - b[i]) <= tolerance)

/** Whether a pixel of `color` is anywhere in rows `top`..`bottom`. */
function shows(png, color, top, bottom) {
  const want = rgb(color)
  for (let y = top; y < bottom; y++) {
    for (let x = 0; x < png.width; x++) if (near(pixel(png, x, y), want, 10)) return true
  }
  return false
}

test('inspect draws a lane per peer with the marks of each message, as Chromium renders it', async (t) => {
  // `npm test` installs it first (pretest:node runs scripts/install-chromium.sh).
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: run scripts/install-chromium.sh`)
  const dir = tempDir(t)
  const relay = await startRelay(t)
  // carol's account is known to the relay and she is away: her message is held in custody.
  const carol = new Protocol(peerConfig('carol', dir, relay.url))
  const carolEvents = record(carol)
  await carol.start()
  await waitFor(carolEvents, connected)
  await carol.stop()
  await until(() => relay.stats().connections === 0, { what: 'the relay to see carol leave' })
  await started(t, peerConfig('bob', dir, relay.url))
  const alice = await started(t, peerConfig('alice', dir, relay.url))

  const toBob = await alice.protocol.sendMessage('bob', 'hi bob')
  const toCarol = await alice.protocol.sendMessage('carol', 'hi carol')
  // No account "dave" exists: the relay's verdict parks the message.
  const toDave = await alice.protocol.sendMessage('dave', 'hi dave')
  await waitFor(alice.recorder, (e) => e.type === 'message_delivered' && e.messageId === toBob)
  await waitFor(alice.recorder, (e) => e.type === 'message_stored' && e.messageId === toCarol)
  await waitFor(alice.recorder, (e) => e.type === 'message_undeliverable' && e.messageId === toDave)

  // Read while alice runs: the reader takes no lock.
  const db = join(dir, 'alice.db')
  const out = join(dir, 'alice.html')
  const cli = spawnSync(process.execPath, [CLI, 'inspect', db, '--out', out], { encoding: 'utf8' })
  assert.equal(cli.status, 0, cli.stderr)
  assert.equal(cli.stdout.trim(), out)
  const html = readFileSync(out, 'utf8')
  assert.match(html, /^<!doctype html>/)
  assert.doesNotMatch(html, /(src|href)="https?:/, 'the page is self-contained')

  const timelines = JSON.parse(native.readMessageLedgers(db, 200))
  const plan = layout(timelines)
  assert.deepEqual(plan.lanes.map((l) => l.peer), ['bob', 'carol', 'dave'])

  const png = join(dir, 'alice.png')
  screenshot(out, png, { width: plan.width, height: plan.height })
  const image = PNG.sync.read(readFileSync(png))
  assert.equal(image.width, plan.width)

  // Each lane's colour fills its band at the right edge, where no mark reaches, and the rows
  // between lanes are the white page.
  const edge = plan.width - 5
  for (const lane of plan.lanes) {
    for (let y = lane.y + 1; y < lane.y + lane.height - 1; y++) {
      assert.ok(near(pixel(image, edge, y), rgb(lane.color)), `${lane.peer}'s lane at row ${y}: ${pixel(image, edge, y)}`)
    }
    assert.ok(near(pixel(image, edge, lane.y + lane.height + 2), [255, 255, 255]), `the gap below ${lane.peer}'s lane`)
  }
  const [bob, carolLane, dave] = plan.lanes
  const band = (lane) => [lane.y, lane.y + lane.height]
  assert.ok(shows(image, MARKS.delivered.color, ...band(bob)), "bob's delivery mark")
  assert.ok(shows(image, MARKS.custody.color, ...band(carolLane)), "carol's custody mark")
  assert.ok(shows(image, MARKS.parked.color, ...band(dave)), "dave's park mark")
  assert.ok(!shows(image, MARKS.delivered.color, ...band(dave)), 'nothing was delivered to dave')
  // Marks of one message closer in time than a few pixels are drawn apart: each attempt shows.
  for (const lane of plan.lanes) assert.ok(shows(image, MARKS.attempt.color, ...band(lane)), `${lane.peer}'s attempt mark`)
  if (process.env.COURIER_SCREENSHOT_OUT) {
    const { copyFileSync } = await import('node:fs')
    copyFileSync(png, process.env.COURIER_SCREENSHOT_OUT)
  }
})

test('inspect refuses what it cannot read, and says how it is used', (t) => {
  const dir = tempDir(t)
  const missing = spawnSync(process.execPath, [CLI, 'inspect', join(dir, 'none.db')], { encoding: 'utf8' })
  assert.equal(missing.status, 1)
  assert.match(missing.stderr, /none\.db: no such database/)
  const usage = spawnSync(process.execPath, [CLI, 'inspect'], { encoding: 'utf8' })
  assert.equal(usage.status, 2)
  assert.match(usage.stderr, /Usage: courier-relay inspect <client\.db>/)
})
