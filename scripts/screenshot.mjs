// Renders a local HTML page in headless Chromium (Debian's `chromium`, installed by
// scripts/install-chromium.sh) and writes a PNG screenshot of it: how the picture test sees
// `courier-relay inspect`'s page, and how the README's screenshot is made.
//
//   node scripts/screenshot.mjs <page.html> <out.png> [width] [height]
import { spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { pathToFileURL } from 'node:url'

export const CHROMIUM = '/usr/bin/chromium'

/** Screenshots `page` at `width` × `height` CSS pixels (device scale 1) into `png`. */
export function screenshot(page, png, { width = 1200, height = 800 } = {}) {
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: run scripts/install-chromium.sh`)
  const profile = mkdtempSync(join(tmpdir(), 'courier-chromium-'))
  try {
    const result = spawnSync(
      CHROMIUM,
      [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--hide-scrollbars',
        '--force-device-scale-factor=1',
        `--user-data-dir=${profile}`,
        `--window-size=${width},${height}`,
        `--screenshot=${resolve(png)}`,
        pathToFileURL(resolve(page)).href,
      ],
      { encoding: 'utf8', timeout: 60_000 },
    )
    if (result.error) throw result.error
    if (result.status !== 0 || !existsSync(png)) {
      throw new Error(`chromium exited with ${result.status}: ${result.stderr}`)
    }
  } finally {
    rmSync(profile, { recursive: true, force: true })
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const [page, png, width, height] = process.argv.slice(2)
  if (!page || !png) {
    process.stderr.write('usage: node scripts/screenshot.mjs <page.html> <out.png> [width] [height]\n')
    process.exit(2)
  }
  screenshot(page, png, { width: Number(width ?? 1200), height: Number(height ?? 800) })
  process.stdout.write(`${resolve(png)}\n`)
}
