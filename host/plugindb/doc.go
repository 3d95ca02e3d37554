// Package plugindb installs a plugin's own database: the tables its
// migrations create in a schema of its own, and the grants its manifest
// declares on the application's tables. A third party writes no role,
// schema or GRANT by hand.
//
//   - plugin_<name> is the plugin's schema, owned by usher_schema_<name>, a
//     NOLOGIN role `host setup --plugin NAME` creates with the schema and
//     makes the runtime's owner a member of. The plugin's login role,
//     usher_plugin_<name>, is not a member: it gets USAGE on the schema and
//     SELECT, INSERT, UPDATE, DELETE on its tables, never DDL or TRUNCATE.
//   - The migrations run as usher_schema_<name> (SET LOCAL ROLE, with
//     search_path plugin_<name>), tracked in plugin_<name>.goose_db_version,
//     all in the install's one transaction. A migration that switches role,
//     grants, creates outside its schema or defines a SECURITY DEFINER
//     function is refused, by its words before it runs and by what the
//     database reports after, and leaves nothing behind.
//   - The grants on the application's tables are exactly the manifest's,
//     column by column; what the last install granted and the manifest no
//     longer lists is revoked. plugin_installs records each install.
//
// Install runs as the runtime's owner, never a superuser: `host plugins
// install`, and a host loading a plugin from its manifest, call it.
package plugindb
