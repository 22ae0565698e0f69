// Stages the npm packages a release publishes, as tarballs: `offline-courier` (the JS facade and
// the loader, with every per-platform package in `optionalDependencies`) and one
// `offline-courier-<triple>` per built addon. The release workflow runs it over the addons of
// every target; the consumer test (`__test__/consumer.test.mjs`) over the one built here, with
// `--host-only`.
//
//   node scripts/stage-packages.mjs --out DIR [--artifacts DIR] [--host-only]
//
// `--artifacts`: where the built `offline-courier.<platform>.node` files are (default: the
// repository root, where `npm run build` puts the host's). The root package is staged from
// exactly the files `npm pack` takes, with the contributor-only scripts and devDependencies
// removed: a registry install never builds anything.
import { execFileSync } from 'node:child_process'
import { cpSync, existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..')
const NAPI = join(ROOT, 'node_modules', '.bin', 'napi')

/** The Rust target of each per-platform package folder under `npm/`. */
export const TARGETS = {
  'linux-x64-gnu': 'x86_64-unknown-linux-gnu',
  'linux-arm64-gnu': 'aarch64-unknown-linux-gnu',
  'linux-x64-musl': 'x86_64-unknown-linux-musl',
  'linux-arm64-musl': 'aarch64-unknown-linux-musl',
  'darwin-x64': 'x86_64-apple-darwin',
  'darwin-arm64': 'aarch64-apple-darwin',
  'win32-x64-msvc': 'x86_64-pc-windows-msvc',
  'win32-arm64-msvc': 'aarch64-pc-windows-msvc',
}

const run = (cmd, args, cwd) => execFileSync(cmd, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] })

/** The platform folders whose addon is in `artifacts`. */
function builtPlatforms(artifacts, name) {
  const pattern = new RegExp(`^${name}\\.(.+)\\.node$`)
  return readdirSync(artifacts)
    .map((file) => pattern.exec(file)?.[1])
    .filter((platform) => platform !== undefined && platform in TARGETS)
}

/** Stages and packs; returns the tarball paths, the root package's first. */
export function stagePackages({ out, artifacts = ROOT, hostOnly = false }) {
  const manifest = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'))
  const stage = join(out, 'stage')
  mkdirSync(stage, { recursive: true })

  const [packed] = JSON.parse(run('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], ROOT))
  for (const { path } of packed.files) cpSync(join(ROOT, path), join(stage, path), { recursive: true })
  cpSync(join(ROOT, 'npm'), join(stage, 'npm'), { recursive: true })
  for (const platform of Object.keys(TARGETS)) cpSync(join(ROOT, 'LICENSE'), join(stage, 'npm', platform, 'LICENSE'))

  const built = builtPlatforms(artifacts, manifest.napi.binaryName)
  if (built.length === 0) throw new Error(`no built addon in ${artifacts}: run npm run build first`)
  const staged = { ...manifest }
  delete staged.scripts
  delete staged.devDependencies
  if (hostOnly) staged.napi = { ...manifest.napi, targets: built.map((platform) => TARGETS[platform]) }
  const targets = Object.fromEntries(Object.entries(TARGETS).map(([platform, triple]) => [triple, platform]))
  const platforms = staged.napi.targets.map((triple) => targets[triple])
  // Every platform package at exactly the root's version: npm installs the one whose os, cpu
  // and libc match, and the loader finds it by name.
  staged.optionalDependencies = Object.fromEntries(platforms.map((platform) => [`${manifest.name}-${platform}`, manifest.version]))
  writeFileSync(join(stage, 'package.json'), `${JSON.stringify(staged, null, 2)}\n`)

  // napi-rs copies each addon into its package; it refuses a target without its addon.
  run(NAPI, ['artifacts', '--output-dir', resolve(artifacts), '--npm-dir', 'npm'], stage)

  const pack = (dir) => join(out, run('npm', ['pack', '--ignore-scripts', '--silent', '--pack-destination', out], dir).trim())
  return [pack(stage), ...platforms.map((platform) => pack(join(stage, 'npm', platform)))]
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({ options: { out: { type: 'string' }, artifacts: { type: 'string' }, 'host-only': { type: 'boolean' } } })
  if (!values.out) {
    console.error('usage: node scripts/stage-packages.mjs --out DIR [--artifacts DIR] [--host-only]')
    process.exit(2)
  }
  const out = resolve(values.out)
  if (existsSync(join(out, 'stage'))) {
    console.error(`${out}/stage exists: stage into an empty directory`)
    process.exit(2)
  }
  for (const tarball of stagePackages({ out, artifacts: values.artifacts, hostOnly: values['host-only'] })) console.log(tarball)
}
