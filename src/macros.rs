//! The crate's one builder macro, [`setters!`]: the `with_*` methods of configs, modules and
//! transforms, written once.

/// Builder methods that take `self` by value, store a value in a field and return `self`,
/// each with its doc comment. Three kinds of item, in any order:
///
/// - `with_x(x: T);` stores the argument in the field of the same name;
/// - `with_x(arg: T) => path.to.field = expr;` stores `expr` (an expression of `arg`);
/// - `with_x(keys) => path.to.field [Wrap], clears cache;` takes any list of keys
///   (`impl IntoIterator<Item = impl Into<NestedKey>>`) and stores them as a `Vec<NestedKey>`,
///   wrapped in `Wrap` (e.g. `Some`) when given, and sets the field `cache` to `None` when
///   named (both parts optional).
///
/// Written inside an `impl` block (`setters! { … }`), or with the type in front
/// (`setters!(Type { … });`) to get the `impl` block too.
macro_rules! setters {
    ($t:ident { $($items:tt)* }) => {
        impl $t {
            $crate::macros::setters! { $($items)* }
        }
    };
    () => {};
    (
        $(#[$doc:meta])*
        $name:ident(keys) => $($field:ident).+ $([$wrap:ident])? $(, clears $cache:ident)?;
        $($rest:tt)*
    ) => {
        $(#[$doc])*
        pub fn $name<K: ::core::convert::Into<$crate::tensordict::NestedKey>>(
            mut self,
            keys: impl ::core::iter::IntoIterator<Item = K>,
        ) -> Self {
            self.$($field).+ = $($wrap)?($crate::tensordict::collect_keys(keys));
            $(self.$cache = None;)?
            self
        }
        $crate::macros::setters! { $($rest)* }
    };
    (
        $(#[$doc:meta])*
        $name:ident($arg:ident: $ty:ty) => $($field:ident).+ = $value:expr;
        $($rest:tt)*
    ) => {
        $(#[$doc])*
        pub fn $name(mut self, $arg: $ty) -> Self {
            self.$($field).+ = $value;
            self
        }
        $crate::macros::setters! { $($rest)* }
    };
    (
        $(#[$doc:meta])*
        $name:ident($arg:ident: $ty:ty);
        $($rest:tt)*
    ) => {
        $(#[$doc])*
        pub fn $name(mut self, $arg: $ty) -> Self {
            self.$arg = $arg;
            self
        }
        $crate::macros::setters! { $($rest)* }
    };
}
pub(crate) use setters;
