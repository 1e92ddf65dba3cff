import { defineConfig } from 'vitest/config';

// Every behavioural suite runs twice, once per backend: the backend is
// chosen at load from CUSTODY_BACKEND, and each test file runs in its own
// forked worker, so the two projects never share a backend.
const backends = ['native', 'js'] as const;

export default defineConfig({
  test: {
    pool: 'forks',
    testTimeout: 30_000,
    hookTimeout: 30_000,
    projects: backends.map((name) => ({
      extends: true,
      test: {
        name,
        include: ['test/**/*.test.ts'],
        env: { CUSTODY_BACKEND: name },
      },
    })),
  },
});
