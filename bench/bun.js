// Bun for the benches that measure it as a peer: its binary, fetched from
// the npm registry into bench/.cache (git-ignored) on first use and reused
// after. Never a dependency of the package: the @oven/bun-<platform>
// packages install on one platform each, so one in devDependencies would
// make `npm ci` fail everywhere else.
//
// The package is chosen for this machine: linux x64 or aarch64, musl or
// glibc, and on x64 the "baseline" build where the CPU lacks AVX2 (the
// default build needs it). `npm pack` fetches and checks the tarball
// (its integrity against the registry's); tar unpacks it. Where any of that
// fails, findBun() says why and the bench skips Bun with that note.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { benchDir } from './lib.js';

// Pinned: a peer's numbers are only comparable run to run at one version.
export const BUN_VERSION = '1.4.5';

const cacheDir = join(benchDir, '.cache');

/** The @oven package for this machine, or { skip } with why there is none. */
function bunPackage() {
  if (process.platform !== 'linux') return { skip: `no Bun package is fetched for ${process.platform}` };
  const arch = { x64: 'x64', arm64: 'aarch64' }[process.arch];
  if (!arch) return { skip: `Bun publishes no linux build for ${process.arch}` };
  // glibcVersionRuntime is absent under musl.
  const musl = !process.report?.getReport?.().header?.glibcVersionRuntime;
  let baseline = false;
  if (arch === 'x64') {
    try {
      baseline = !/^flags\s*:.*\bavx2\b/m.test(readFileSync('/proc/cpuinfo', 'utf8'));
    } catch {
      baseline = true; // unknown CPU: the build that runs everywhere
    }
  }
  return { name: `@oven/bun-linux-${arch}${musl ? '-musl' : ''}${baseline ? '-baseline' : ''}` };
}

/**
 * The path of a Bun binary that runs here, fetching it on first use:
 * { path, version, pkg } or { skip: why }.
 */
export function findBun() {
  const pkg = bunPackage();
  if (pkg.skip) return { skip: pkg.skip };
  const dir = join(cacheDir, `${pkg.name.replace('@oven/', '')}-${BUN_VERSION}`);
  const bin = join(dir, 'package', 'bin', 'bun');
  try {
    if (!existsSync(bin)) fetchInto(pkg.name, dir);
    const version = execFileSync(bin, ['--version'], { encoding: 'utf8', timeout: 30_000, env: bunEnv() }).trim();
    return { path: bin, version, pkg: `${pkg.name}@${BUN_VERSION}` };
  } catch (err) {
    return { skip: `${pkg.name}@${BUN_VERSION} does not run here: ${String(err.message).split('\n')[0]}` };
  }
}

/** npm pack <pkg>@<version> into a private dir, unpack it, then rename into place (a concurrent run sees all or nothing). */
function fetchInto(name, dir) {
  mkdirSync(cacheDir, { recursive: true });
  const tmp = `${dir}.${process.pid}.tmp`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp);
  try {
    // cwd is the cache, not the repository: npm must not look at our package.json.
    const out = execFileSync('npm', ['pack', `${name}@${BUN_VERSION}`, '--silent', '--pack-destination', tmp], {
      cwd: tmp,
      encoding: 'utf8',
      timeout: 300_000,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const tarball = out.trim().split('\n').pop();
    execFileSync('tar', ['-xzf', join(tmp, tarball), '-C', tmp], { timeout: 120_000 });
    rmSync(join(tmp, tarball));
    renameSync(tmp, dir);
  } catch (err) {
    rmSync(tmp, { recursive: true, force: true });
    throw new Error(
      `fetching ${name}@${BUN_VERSION} failed: ${String(err.stderr || err.message)
        .trim()
        .split('\n')
        .pop()}`,
    );
  }
}

/** Bun's environment: nothing cached outside the repository. */
export function bunEnv(env = process.env) {
  return { ...env, BUN_RUNTIME_TRANSPILER_CACHE_PATH: '0', DO_NOT_TRACK: '1' };
}
