// The short soak under attack (`npm run soak` runs the long one): honest clients deliver through
// a relay while every attack of scripts/soak/attacker.mjs runs at once. Nothing honest may be lost
// or fail, and the relay's memory stays bounded. Rates and latencies are reported by the long
// soak, never asserted here.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { soak } from '../scripts/soak.mjs'

test('under every attack at once, honest messages are all delivered and the relay stays bounded', async () => {
  const r = await soak({ seconds: 3, pairs: 3, rate: 60, drainSeconds: 120 })
  for (const run of [r.alone, r.attacked]) {
    assert.deepEqual({ delivered: run.delivered, failed: run.failed, lost: run.lost }, { delivered: run.offered, failed: 0, lost: 0 })
  }
  // Each attack ran: its frames reached the relay and were refused or metered.
  for (const what of ['unauthenticated opened', 'tokens guessed', 'oversized first frames', 'filler frames sent', 'watch frames of 4096', 'sink sessions']) {
    assert.ok(r.attacks[what] > 0, `${what}: ${r.attacks[what]}`)
  }
  assert.ok(r.attacks['guesses refused for the source'] > 0, 'the guesser was never refused for its source')
  // A relay that buffered what the attacks send would hold hundreds of MiB by now.
  assert.ok(r.attacked.relayRssMax < r.rssIdle + 192 * 2 ** 20, `relay RSS ${r.attacked.relayRssMax} from ${r.rssIdle} idle`)
})
