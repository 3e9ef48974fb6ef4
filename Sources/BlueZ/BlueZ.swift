// The Swift D-Bus layer and the BlueZ GATT peripheral (issue #4).
