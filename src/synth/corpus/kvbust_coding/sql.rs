//! SQL for the coding corpus: schema DDL and migrations, analytic queries with joins, CTEs and
//! window functions, upserts, and `EXPLAIN` output. Owns these templates; must never emit text
//! that was not composed here from the vocabularies.

use super::draw::Draw;

/// One SQL block.
pub fn block(d: &mut Draw) -> String {
    match d.weighted(&[30, 35, 20, 15]) {
        0 => ddl(d),
        1 => query(d),
        2 => upsert(d),
        _ => explain(d),
    }
}

fn col_type(d: &mut Draw) -> &'static str {
    d.s(&[
        "BIGINT",
        "INTEGER",
        "TEXT",
        "VARCHAR(255)",
        "BOOLEAN",
        "TIMESTAMPTZ",
        "NUMERIC(12, 2)",
        "JSONB",
        "UUID",
        "DOUBLE PRECISION",
    ])
}

fn table(d: &mut Draw) -> String {
    format!("{}s", d.noun_snake())
}

fn ddl(d: &mut Draw) -> String {
    let mut out = String::new();
    let t = table(d);
    if d.chance(0.5) {
        w!(
            out,
            "-- migrations/{:04}_{}.sql",
            d.int(1, 300),
            d.fn_snake()
        );
    }
    w!(out, "CREATE TABLE IF NOT EXISTS {t} (");
    w!(
        out,
        "    id {} PRIMARY KEY,",
        d.s(&[
            "BIGSERIAL",
            "UUID DEFAULT gen_random_uuid()",
            "BIGINT GENERATED ALWAYS AS IDENTITY"
        ])
    );
    let mut cols = Vec::new();
    for _ in 0..d.n(3, 8) {
        let c = d.noun_snake();
        if cols.contains(&c) || c == "id" {
            continue;
        }
        w!(
            out,
            "    {c} {}{},",
            col_type(d),
            d.s(&["", " NOT NULL", " NOT NULL DEFAULT now()", "", " UNIQUE"])
        );
        cols.push(c);
    }
    let fk = d.noun_snake();
    w!(
        out,
        "    {fk}_id BIGINT REFERENCES {fk}s(id) ON DELETE {},",
        d.s(&["CASCADE", "SET NULL", "RESTRICT"])
    );
    w!(out, "    created_at TIMESTAMPTZ NOT NULL DEFAULT now()");
    w!(out, ");");
    w!(out);
    if let Some(c) = cols.first() {
        w!(
            out,
            "CREATE INDEX {}idx_{t}_{c} ON {t} ({c}{});",
            d.s(&["", "CONCURRENTLY "]),
            d.s(&["", ", created_at DESC"])
        );
    }
    w!(out, "CREATE INDEX idx_{t}_{fk}_id ON {t} ({fk}_id);");
    if d.chance(0.5) {
        w!(out);
        w!(
            out,
            "ALTER TABLE {t} ADD COLUMN {} {} DEFAULT {};",
            d.noun_snake(),
            col_type(d),
            d.s(&["NULL", "0", "false", "'{}'"])
        );
    }
    out
}

fn query(d: &mut Draw) -> String {
    let mut out = String::new();
    let a = table(d);
    let b = table(d);
    let (ka, kb) = (&a[..1], &b[..1]);
    let ka = if ka == kb {
        format!("{ka}1")
    } else {
        ka.to_string()
    };
    let q = Query {
        a: &a,
        b: &b,
        ka: &ka,
        kb,
        metric: d.noun_snake(),
        group: d.noun_snake(),
    };
    if d.chance(0.5) {
        query_ranked(d, &mut out, &q);
    } else {
        query_totals(d, &mut out, &q);
    }
    out
}

/// The two tables of a query, their aliases and the columns it aggregates.
struct Query<'a> {
    a: &'a str,
    b: &'a str,
    ka: &'a str,
    kb: &'a str,
    metric: String,
    group: String,
}

/// A CTE over recent rows of `a`, ranked per group and joined to `b`.
fn query_ranked(d: &mut Draw, out: &mut String, q: &Query) {
    let Query {
        a,
        b,
        ka,
        kb,
        metric,
        group,
    } = q;
    w!(out, "-- {}", d.sentence());
    w!(out, "WITH recent AS (");
    w!(
        out,
        "    SELECT {ka}.id, {ka}.{group}, {ka}.{metric}, {ka}.created_at"
    );
    w!(out, "    FROM {a} {ka}");
    w!(
        out,
        "    WHERE {ka}.created_at >= now() - interval '{} {}'",
        d.int(1, 90),
        d.s(&["days", "hours", "minutes"])
    );
    w!(
        out,
        "      AND {ka}.status {}",
        d.s(&["= 'active'", "<> 'deleted'", "IN ('pending', 'running')"])
    );
    w!(out, "), ranked AS (");
    w!(
        out,
        "    SELECT *, row_number() OVER (PARTITION BY {group} ORDER BY {metric} DESC) AS rn"
    );
    w!(out, "    FROM recent");
    w!(out, ")");
    w!(out, "SELECT r.{group}, count(*) AS n, avg(r.{metric}) AS avg_{metric}, percentile_cont(0.{}) WITHIN GROUP (ORDER BY r.{metric}) AS p{}", d.s(&["5", "9", "95", "99"]), d.s(&["50", "90", "95", "99"]));
    w!(out, "FROM ranked r");
    w!(
        out,
        "JOIN {b} {kb} ON {kb}.{}_id = r.id",
        a.trim_end_matches('s')
    );
    w!(out, "WHERE r.rn <= {}", d.int(1, 100));
    w!(out, "GROUP BY r.{group}");
    w!(out, "HAVING count(*) > {}", d.int(1, 50));
    w!(out, "ORDER BY n DESC");
    w!(out, "LIMIT {};", d.int(10, 500));
}

/// Per-row totals of `b` left-joined to a tenant's rows of `a`.
fn query_totals(d: &mut Draw, out: &mut String, q: &Query) {
    let Query {
        a,
        b,
        ka,
        kb,
        metric,
        group,
    } = q;
    w!(out, "SELECT {ka}.id,");
    w!(out, "       {ka}.{group},");
    w!(
        out,
        "       coalesce(sum({kb}.{metric}), 0) AS total_{metric},"
    );
    w!(out, "       max({kb}.updated_at) AS last_seen");
    w!(out, "FROM {a} {ka}");
    w!(
        out,
        "LEFT JOIN {b} {kb} ON {kb}.{}_id = {ka}.id AND {kb}.{} IS {}",
        a.trim_end_matches('s'),
        d.noun_snake(),
        d.s(&["NULL", "NOT NULL", "TRUE"])
    );
    w!(out, "WHERE {ka}.tenant_id = ${}", d.int(1, 3));
    w!(
        out,
        "  AND {ka}.{} {}",
        d.noun_snake(),
        d.s(&[
            "ILIKE '%' || $2 || '%'",
            "= ANY($2)",
            "BETWEEN $2 AND $3",
            "IS NOT NULL"
        ])
    );
    w!(out, "GROUP BY {ka}.id, {ka}.{group}");
    w!(out, "ORDER BY total_{metric} DESC NULLS LAST");
    w!(out, "LIMIT {} OFFSET {};", d.int(10, 100), d.int(0, 1000));
}

fn upsert(d: &mut Draw) -> String {
    let mut out = String::new();
    let t = table(d);
    let cols: Vec<String> = (0..d.n(2, 5)).map(|_| d.noun_snake()).collect();
    w!(out, "INSERT INTO {t} (id, {})", cols.join(", "));
    w!(out, "VALUES");
    let rows = d.n(2, 5);
    for r in 0..rows {
        let vals: Vec<String> = cols
            .iter()
            .map(|_| match d.n(0, 3) {
                0 => d.int(0, 99_999).to_string(),
                1 => format!("'{}'", d.noun_phrase()),
                2 => d.s(&["true", "false", "NULL", "now()"]).to_string(),
                _ => format!("{:.2}", d.float(0.0, 999.0)),
            })
            .collect();
        w!(
            out,
            "    ({}, {}){}",
            d.int(1, 1_000_000),
            vals.join(", "),
            if r + 1 == rows { "" } else { "," }
        );
    }
    w!(out, "ON CONFLICT (id) DO UPDATE SET");
    let sets: Vec<String> = cols
        .iter()
        .map(|c| format!("    {c} = EXCLUDED.{c}"))
        .collect();
    w!(out, "{},", sets.join(",\n"));
    w!(out, "    updated_at = now()");
    w!(out, "RETURNING id, {};", cols[0]);
    if d.chance(0.5) {
        w!(out);
        w!(
            out,
            "UPDATE {t} SET status = '{}' WHERE {} < now() - interval '{} days' AND status = '{}';",
            d.s(&["archived", "expired", "stale"]),
            d.s(&["updated_at", "created_at", "last_seen_at"]),
            d.int(7, 365),
            d.s(&["active", "pending"])
        );
    }
    out
}

fn explain(d: &mut Draw) -> String {
    let mut out = String::new();
    let t = table(d);
    let c = d.noun_snake();
    w!(out, "{} EXPLAIN (ANALYZE, BUFFERS) SELECT * FROM {t} WHERE {c} = {} ORDER BY created_at DESC LIMIT {};", d.s(&["postgres=#", "app=>", "db=#"]), d.int(1, 99_999), d.int(10, 100));
    w!(out, "                                QUERY PLAN");
    w!(
        out,
        "--------------------------------------------------------------------------"
    );
    let cost = d.float(0.4, 9000.0);
    let time = d.float(0.01, 900.0);
    w!(out, " Limit  (cost={:.2}..{:.2} rows={} width={}) (actual time={:.3}..{time:.3} rows={} loops=1)", cost * 0.1, cost, d.int(1, 100), d.int(40, 400), time * 0.1, d.int(0, 100));
    if d.chance(0.5) {
        w!(out, "   ->  Index Scan Backward using idx_{t}_created_at on {t}  (cost=0.43..{:.2} rows={} width={}) (actual time=0.02..{time:.3} rows={} loops=1)", cost * 40.0, d.int(100, 900_000), d.int(40, 400), d.int(1, 100));
        w!(out, "         Filter: ({c} = {})", d.int(1, 99_999));
        w!(
            out,
            "         Rows Removed by Filter: {}",
            d.int(0, 500_000)
        );
    } else {
        w!(
            out,
            "   ->  Sort  (cost={:.2}..{:.2} rows={} width={})",
            cost * 0.9,
            cost,
            d.int(100, 90_000),
            d.int(40, 400)
        );
        w!(out, "         Sort Key: created_at DESC");
        w!(
            out,
            "         Sort Method: {}",
            d.s(&[
                "top-N heapsort  Memory: 32kB",
                "quicksort  Memory: 1204kB",
                "external merge  Disk: 18432kB"
            ])
        );
        w!(out, "         ->  Seq Scan on {t}  (cost=0.00..{:.2} rows={} width={}) (actual time=0.011..{time:.3} rows={} loops=1)", cost * 0.8, d.int(100, 9_000_000), d.int(40, 400), d.int(1, 90_000));
        w!(out, "               Filter: ({c} = {})", d.int(1, 99_999));
    }
    w!(
        out,
        "   Buffers: shared hit={} read={}",
        d.int(0, 90_000),
        d.int(0, 90_000)
    );
    w!(out, " Planning Time: {:.3} ms", d.float(0.05, 3.0));
    w!(out, " Execution Time: {time:.3} ms");
    w!(out, "({} rows)", d.int(6, 9));
    out
}
