// A short crash run: the relay and both apps SIGKILLed at seeded random moments and restarted
// on the same files; nothing accepted may be lost or delivered twice, and what was sent to the
// other app with nothing in its way is delivered (scripts/crash-run.mjs).
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { test } from 'node:test'
import { fileURLToPath } from 'node:url'

const SCRIPT = fileURLToPath(new URL('../scripts/crash-run.mjs', import.meta.url))

function run(args) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [SCRIPT, ...args], { stdio: ['ignore', 'pipe', 'inherit'] })
    let out = ''
    child.stdout.on('data', (chunk) => (out += chunk))
    child.once('error', reject)
    child.once('exit', (code) => resolve({ code, out }))
  })
}

async function tenKills(extra) {
  const { code, out } = await run(['--kills', '10', '--seed', '7', '--lifetime-ms', '4000', '--json', ...extra])
  const report = JSON.parse(out.trim().split('\n').at(-1))
  assert.deepEqual(report.violations, [])
  assert.equal(code, 0)
  assert.equal(report.kills.total, 10)
  assert.equal(report.kills.relay + report.kills.alice + report.kills.bob, 10)
  assert.equal(report.lost, 0)
  assert.equal(report.duplicates, 0)
  assert.ok(report.messages > 0, 'the apps sent messages')
  const failed = Object.values(report.failed).reduce((a, b) => a + b, 0)
  assert.equal(report.delivered + failed, report.messages, 'every accepted message settled')
  // The liveness check had something to judge: messages with no kill and no lost connection in
  // their life, which must all have been delivered (else they are among the violations).
  assert.ok(report.undisturbed > 0, 'the calm tail sent messages with nothing in their way')
  assert.ok(report.delivered > 0)
  return report
}

test('ten kills across the relay and both apps lose nothing, deliver nothing twice and deliver what nothing stood in the way of', async () => {
  await tenKills([])
})

test('the same with every message sealed in MLS sessions: nothing lost to a ratchet, nothing opened twice', async () => {
  await tenKills(['--encryption'])
})
